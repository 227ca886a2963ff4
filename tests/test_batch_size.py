"""--batch-size auto leaves every epoch enough optimizer steps, and --lr-scaling moves the learning rate
with the batch (linear, sqrt, none), with Goyal et al.'s warmup when it grows."""

import json

import pytest

from common.batchsize import MIN_STEPS_PER_EPOCH, WARMUP_EPOCHS, scaled_lr, steps_limit
from tests.conftest import load_json
from train import main

QUIET = ["--wandb", "disabled"]


def test_the_floor_caps_the_micro_batch_so_every_epoch_keeps_its_steps():
    for train_size, shards in ((1437, 1), (1437, 2), (1437, 4), (3336, 2), (50_000, 8), (10, 1)):
        micro = steps_limit(train_size, shards)
        assert micro >= 1
        if train_size >= MIN_STEPS_PER_EPOCH * shards:
            assert train_size // (micro * shards) >= MIN_STEPS_PER_EPOCH  # the floor holds
            assert train_size // ((micro + 1) * shards) < MIN_STEPS_PER_EPOCH or micro == train_size  # the largest


def test_auto_on_digits_no_longer_takes_one_step_an_epoch(tmp_path, capsys):
    """The report: auto picked 1,024 of 1,437 training images, one step an epoch, accuracy 0.1."""
    run = tmp_path / "run"
    assert main(["--paper", "resnet", "--batch-size", "auto", "--epochs", "1", "--out", str(run),
                 "--results-dir", str(tmp_path / "r"), *QUIET]) == 0
    result, config = load_json(run / "result.json"), load_json(run / "config.json")
    assert result["steps"] >= MIN_STEPS_PER_EPOCH and result["batch_size"] == config["batch_size"] == 64
    assert result["lr"] == config["lr"] == 3e-3  # the paper's batch: nothing to scale
    assert "batch size auto: 64 per device" in capsys.readouterr().out


def test_the_learning_rate_scales_linearly_or_by_the_square_root_or_not_at_all():
    assert scaled_lr(1e-3, 256, 64, "linear")[0] == pytest.approx(4e-3)
    assert scaled_lr(1e-3, 256, 64, "sqrt")[0] == pytest.approx(2e-3)
    assert scaled_lr(1e-3, 16, 64, "linear")[0] == pytest.approx(2.5e-4)
    assert scaled_lr(1e-3, 16, 64, "sqrt")[0] == pytest.approx(5e-4)
    assert scaled_lr(1e-3, 256, 64, "none")[0] == 1e-3
    assert scaled_lr(1e-3, 256, None, "linear")[0] == 1e-3  # a config from before --lr-scaling: as it was
    assert "1e-3 x 256/64" in scaled_lr(1e-3, 256, 64, "linear")[1].replace("0.001", "1e-3")
    with pytest.raises(ValueError, match="unknown lr scaling 'cubic'"):
        scaled_lr(1e-3, 256, 64, "cubic")


def logged_lrs(run) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/lr"] for r in rows if "train/lr" in r}


def test_the_optimizer_trains_with_the_scaled_learning_rate_and_none_keeps_the_given_one(tmp_path, capsys):
    flags = ["--paper", "resnet", "--batch-size", "16", "--max-steps", "6", "--log-every", "1", *QUIET,
             "--results-dir", str(tmp_path / "r")]
    lrs = {}
    for rule in ("linear", "sqrt", "none"):
        capsys.readouterr()
        assert main(flags + ["--lr-scaling", rule, "--out", str(tmp_path / rule)]) == 0
        config, result = load_json(tmp_path / rule / "config.json"), load_json(tmp_path / rule / "result.json")
        assert (config["batch_size"], config["lr_batch"], config["lr"], config["lr_scaling"]) == (16, 64, 3e-3, rule)
        assert result["warmup_steps"] == config["warmup_steps"] == 20  # a smaller batch adds no warmup
        lrs[rule] = logged_lrs(tmp_path / rule)
        assert f"batch 16, lr {result['lr']:.4g}" in capsys.readouterr().out
    assert load_json(tmp_path / "none" / "result.json")["lr"] == 3e-3
    for step in range(1, 7):  # the same warmup, the peak scaled: 16/64 and sqrt(16/64)
        assert lrs["linear"][step] == pytest.approx(0.25 * lrs["none"][step], rel=1e-9)
        assert lrs["sqrt"][step] == pytest.approx(0.5 * lrs["none"][step], rel=1e-9)


@pytest.mark.slow  # trains, exports or compiles: the whole suite's, not the everyday lane's
def test_a_larger_batch_gets_goyals_warmup_of_five_epochs(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["--paper", "resnet", "--batch-size", "256", "--epochs", str(WARMUP_EPOCHS + 1), "--log-every", "1",
                 "--out", str(run), "--results-dir", str(tmp_path / "r"), *QUIET]) == 0
    result, steps = load_json(run / "result.json"), 1437 // 256
    assert result["lr"] == pytest.approx(3e-3 * 4) and result["warmup_steps"] == WARMUP_EPOCHS * steps
    lrs = logged_lrs(run)
    assert max(lrs.values()) == pytest.approx(3e-3 * 4, rel=0.05)  # the peak, reached after the warmup
    assert lrs[1] < lrs[2] < lrs[WARMUP_EPOCHS * steps - 1]  # rising through the warmup
    out = capsys.readouterr().out
    assert "batch 256, lr 0.012 (0.003 x 256/64, linear scaling from the paper's batch of 64; warmup 25 steps" in out


@pytest.mark.parametrize("flags, words", [
    (["--paper", "resnet", "--lr-scaling", "cubic"], ["--lr-scaling", "cubic", "linear", "sqrt", "none"]),
    (["--paper", "gpt", "--batch-size", "auto", "--max-steps", "3"],
     ["--max-steps 3 ends before the", "warmup", "batch 128", "--lr-scaling none"]),
    (["--paper", "resnet", "--batch-size", "256", "--max-steps", "3"], ["--max-steps 3 ends before the 25-step warmup"]),
])
def test_bad_scaling_flags_are_one_line_and_exit_2(flags, words, tmp_path, capsys):
    assert main(flags + ["--out", str(tmp_path / "run"), "--results-dir", str(tmp_path / "r"), *QUIET]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err


def test_the_batch_bench_reads_the_time_to_the_target_and_tabulates_and_plots_each_batch(tmp_path, monkeypatch):
    from common import bench_batch

    evaluations = [{"eval/accuracy": a, "time/wall_s": t, "epoch": e}
                   for e, (a, t) in enumerate(((0.5, 3.0), (0.96, 6.0), (0.97, 9.0)), 1)]
    assert bench_batch.time_to(evaluations, "accuracy", 0.95, True) == (6.0, 2)
    assert bench_batch.time_to(evaluations, "accuracy", 0.99, True) is None
    assert bench_batch.time_to([{"eval/mse": 0.2, "time/wall_s": 1.0, "epoch": 1},
                                {"eval/mse": 0.05, "time/wall_s": 2.0, "epoch": 2}], "mse", 0.1, False) == (2.0, 2)

    def fake_run(flags):  # auto picks 32; a bigger batch goes faster per sample and gets there later
        batch = 32 if "auto" in flags else int(flags[flags.index("--batch-size") + 1])
        result = {"batch_size": batch, "dataset": "digits", "steps": 1437 // batch * 2, "epochs": 2,
                  "samples_per_s": 100.0 * batch ** 0.5, "metric": "accuracy", "final": 0.97, "wall_s": 10.0,
                  "higher_is_better": True, "lr": 1e-3 * batch / 64, "warmup_steps": 20, "config": {}}
        return result, [{"eval/accuracy": 0.96 if batch < 128 else 0.9, "time/wall_s": 1.0 + batch / 16, "epoch": 1}]

    monkeypatch.setattr(bench_batch, "run", fake_run)
    text = bench_batch.report(["resnet"], 0.95, str(tmp_path / "batch.png"))
    lines = text.splitlines()
    assert [line.split("|")[2].strip() for line in lines[2:6]] == ["16", "32 (auto)", "64", "128 (< floor)"]
    assert "| resnet | 16 | 89 | 0.00025 | 20 | 400 | accuracy 0.97 | 2.0 (epoch 1) | 10 |" == lines[2]
    assert "not reached" in lines[5] and (tmp_path / "batch.png").stat().st_size > 10_000


def test_a_run_at_a_scaled_learning_rate_resumes_bitwise(tmp_path):
    """config.json keeps lr and lr_batch as given: the resumed run scales to the same rate."""
    from tests.conftest import bitwise_equal, interrupted_copy, weights

    assert main(["--paper", "resnet", "--batch-size", "32", "--lr-scaling", "sqrt", "--max-steps", "6",
                 "--ckpt-every", "3", "--keep-ckpts", "5", "--out", str(tmp_path / "whole"),
                 "--results-dir", str(tmp_path / "r"), *QUIET]) == 0
    resumed = interrupted_copy(tmp_path / "whole", 3, tmp_path / "resumed")
    assert main(["--resume", str(resumed)]) == 0
    assert bitwise_equal(weights(resumed), weights(tmp_path / "whole"))
    assert load_json(resumed / "result.json")["lr"] == pytest.approx(3e-3 * 0.5 ** 0.5)
