"""Speed accounting: FLOP counts, peaks, MFU and throughput in the results, compile, --batch-size auto,
and profiling (the bench: test_bench.py)."""

import json

import pytest
import torch
import torch.nn as nn

from common.throughput import peak_flops, training_flops
from tests.conftest import load_json
from train import main

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`


def test_training_flops_count_forward_and_both_gradients():
    """Per weight and sample: forward 2 FLOPs, the weight gradient 2, the input gradient 2
    (not for the first layer, whose input needs no gradient)."""
    x, y = torch.randn(32, 20), torch.randint(0, 5, (32,))
    flops = training_flops(lambda: nn.Sequential(nn.Linear(20, 16, bias=False), nn.Linear(16, 5, bias=False)), x, y,
                           lambda m, x, y: nn.functional.cross_entropy(m(x), y))
    assert flops == 32 * (4 * 20 * 16 + 6 * 16 * 5)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_grouped_convolution_counts_a_groups_share_of_the_flops(transposed):
    """G groups are G convolutions of 1/G of the channels each: forward, input gradient and weight gradient
    all G times fewer FLOPs than one group's (torch's own formula counted the weight gradient ungrouped).
    A 1x1 convolution first, so that the grouped one computes its input's gradient too."""
    x, y = torch.randn(4, 64, 14, 14), torch.randint(0, 5, (4,))
    conv = nn.ConvTranspose2d if transposed else nn.Conv2d

    def flops(groups: int) -> float:
        return training_flops(lambda: nn.Sequential(nn.Conv2d(64, 64, 1, bias=False),
                                                    conv(64, 64, 3, stride=2, padding=1, groups=groups, bias=False)),
                              x, y, lambda m, x, y: m(x).mean())

    first = 2 * (2 * 64 * 64 * 14 * 14 * 4)  # the 1x1's forward and weight gradient (its input needs none)
    assert flops(32) - first == (flops(1) - first) / 32
    assert flops(64) - first == (flops(1) - first) / 64


def test_peak_comes_from_the_table_for_known_gpus_and_is_measured_elsewhere(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    peak, source = peak_flops(torch.device("cuda"), "bf16")
    assert peak == 989e12 and source.startswith("table: NVIDIA H100")
    peak, source = peak_flops(torch.device("cpu"), "fp32")
    assert peak > 1e8 and source.startswith("measured: fp32 1024x1024 matmul on cpu")


def test_results_and_metrics_carry_throughput_and_mfu(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["--paper", "vit", "--max-steps", "20", "--log-every", "5", "--wandb", "disabled",
                 "--out", str(run)]) == 0
    out = capsys.readouterr()
    # not a terminal: a plain line per logged step, with the MFU, instead of a progress bar
    assert "GFLOP per sample" in out.out and "peak measured" in out.out and "step 20/20: loss " in out.out
    assert ", mfu " in out.out and "\r" not in out.err
    result = load_json(run / "result.json")
    assert 0 < result["mfu"] < 1 and result["pixels_per_s"] == pytest.approx(64 * result["samples_per_s"])
    assert result["flops_per_sample"] > 0 and 0 <= result["data_wait"] < 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    speed = [r for r in rows if "train/mfu" in r]
    assert [r["step"] for r in speed] == [5, 10, 15, 20]
    assert all(r["train/samples_per_s"] > 0 and r["train/pixels_per_s"] > 0 and 0 <= r["train/data_wait"] < 1
               for r in speed)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_training_follows_the_eager_loss_curve(tmp_path, backend):
    flags = ["--paper", "resnet", "--max-steps", "8", "--log-every", "1", "--wandb", "disabled"]
    assert main(flags + ["--out", str(tmp_path / "eager")]) == 0
    assert main(flags + ["--compile", "--compile-backend", backend, "--out", str(tmp_path / "compiled")]) == 0
    curves = []
    for name in ("eager", "compiled"):
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        curves.append([r["train/loss"] for r in rows if "train/loss" in r])
    assert len(curves[0]) == 8
    assert curves[1] == pytest.approx(curves[0], rel=1e-4)  # float rounding may differ after a few steps
    result = load_json(tmp_path / "compiled" / "result.json")
    assert result["compile"] is True and result["recompiles"] >= 0  # evaluation (eval mode) may add graphs


def test_batch_size_auto_picks_a_power_of_two_and_records_it(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["--paper", "vit", "--batch-size", "auto", "--max-steps", "2", "--wandb", "disabled",
                 "--out", str(run)]) == 0
    result, config = load_json(run / "result.json"), load_json(run / "config.json")
    batch = result["batch_size"]
    assert batch == config["batch_size"] and batch & (batch - 1) == 0 and 8 <= batch <= 1437
    assert f"batch size auto: {batch} per device" in capsys.readouterr().out


def test_profile_records_n_steps_writes_a_trace_and_prints_the_top_operators(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["--paper", "vit", "--max-steps", "8", "--profile", "3", "--wandb", "disabled", "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "profile of steps 3 to 5, operators by self time" in out and "Self CPU" in out and "aten::addmm" in out
    events = json.loads((run / "profile" / "trace_rank0.json").read_text())["traceEvents"]
    steps = sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"], "the 3rd to 5th steps, after 2 warm-up"
    assert main(["--paper", "vit", "--max-steps", "4", "--profile", "3", "--wandb", "disabled",
                 "--out", str(tmp_path / "short")]) == 2
    assert "--profile 3 records steps 3 to 5, but this run has 4 steps" in capsys.readouterr().err
    assert not (tmp_path / "short").exists()


def test_the_device_monitor_reads_cuda_peaks_and_utilization(monkeypatch):
    """The CUDA branch, on a machine without a GPU: torch.cuda's readings stood in for."""
    from common.monitor import DeviceMonitor, short_bytes

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 4 * 2**30)
    readings = iter([40.0, 60.0])
    monkeypatch.setattr(torch.cuda, "utilization", lambda device=None: next(readings))
    monitor = DeviceMonitor(torch.device("cuda", 0))
    first, second = monitor.read(), monitor.read()
    assert first["peak_allocated_bytes"] == 3 * 2**30 and first["peak_reserved_bytes"] == 4 * 2**30
    assert (first["utilization"], second["utilization"]) == (40.0, 60.0) and first["peak_rss_bytes"] > 0
    assert monitor.summary()["mean_utilization"] == 50.0 and "utilization" not in monitor.summary()
    assert short_bytes(3 * 2**30) == "3.0G" and short_bytes(1536) == "1.5K"
    assert "peak_allocated_bytes" not in DeviceMonitor(torch.device("cpu")).read()
