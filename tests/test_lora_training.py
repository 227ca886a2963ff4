"""LoRA runs (--lora RANK, common.lora): GPT tiny pre-trained on pydoc-rest, its classifier fine-tuned on
pydoc-topics with the update of W_q and W_v alone. The optimizer holds the update and the new head alone, the
checkpoints and model.safetensors hold them alone (a few hundred KB), a resumed run equals an uninterrupted one,
the final update read onto the base run's weights gives the run's test metrics again, the exported model is
merged and onnxruntime gives the unmerged model's outputs, ddp and fsdp with the frozen base train the one-process
weights, and mistakes are one line."""

import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from common import checkpoint, parallel
from common.config import build_parser, resolve, validate
from common.evaluate import evaluate_run
from common.export import load_run
from common.trainer import Trainer
from tests.conftest import (bitwise_equal, interrupted_copy, load_json, made_once, max_difference, refused,
                            torchrun_many, weights)
from train import main

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

R, LAYERS, D = 4, 4, 128  # the rank; GPT tiny's blocks and width
UPDATE = [f"blocks.{i}.attn.W_qkv.{m}" for i in range(LAYERS) for m in "AB"]  # W_q's and W_v's pairs, stacked
HEAD = ["W_y.weight", "W_y.bias"]  # the classifier's new head (8 topics), left new by --init
# dropout off (the ranks of ddp and fsdp draw other masks than one process); lr 0.01: the update moves
LORA = ["--paper", "gpt", "--flavor", "tiny-classifier", "--lora", str(R), "--model-kwargs", "dropout=0.0",
        "--max-steps", "4", "--batch-size", "16", "--lr", "0.01", "--ckpt-every", "2", "--log-every", "1",
        "--wandb", "disabled"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """GPT tiny, 2 steps on pydoc-rest (the text without the eight topics): the run LoRA adapts."""
    def make(folder):
        assert main(["--paper", "gpt", "--dataset", "pydoc-rest", "--max-steps", "2", "--seed", "1", "--wandb",
                     "disabled", "--out", str(folder / "run"), "--results-dir", str(folder / "results")]) == 0

    return made_once(tmp_path_factory, "lora-base-pydoc-rest", make) / "run"


@pytest.fixture(scope="module")
def lora_run(base, tmp_path_factory):
    """The LoRA run in one process, a checkpoint every 2 of its 4 steps."""
    def make(folder):
        assert main(LORA + ["--init", str(base), "--out", str(folder / "run"),
                            "--results-dir", str(folder / "results")]) == 0

    return made_once(tmp_path_factory, "lora-run", make) / "run"


def test_the_optimizer_holds_the_update_and_the_new_head_alone(base, tmp_path):
    """What the trainer builds, up to its optimizer: every parameter it steps is an A, a B or the new head's,
    each once, and every other parameter is frozen (the base, tied embeddings included)."""
    flags = vars(build_parser().parse_args(LORA + ["--init", str(base), "--out", str(tmp_path / "run")]))
    cfg = resolve(flags)
    validate(cfg)
    trainer = Trainer(cfg, parallel.setup(), [], resuming=False)
    trainer.adapt(trainer.load_pretrained())
    trainer.parallelize()
    trainer.build_optimizer()
    names = {id(p): name for name, p in trainer.model.named_parameters()}
    held = [names[id(p)] for group in trainer.optimizer.param_groups for p in group["params"]]
    assert sorted(held) == sorted(UPDATE + HEAD)
    assert {name for name, p in trainer.model.named_parameters() if p.requires_grad} == set(UPDATE + HEAD)
    assert trainer.n_trainable == LAYERS * 2 * R * (D + D) + 8 * D + 8  # r (k + d) per pair; the head
    base_weights = weights(base)
    for name, p in trainer.model.named_parameters():  # the frozen base: the pre-trained run's, exactly
        if name not in held:
            assert torch.equal(p, base_weights[name.replace(".W_0.", ".")]), name


def test_result_json_records_the_trainable_and_the_total_parameters(base, lora_run):
    result, pretrained = load_json(lora_run / "result.json"), load_json(base / "result.json")
    head, update = 8 * D + 8, LAYERS * 2 * R * (D + D)
    assert result["trainable_params"] == update + head
    assert result["params"] == pretrained["params"] + update + head  # the base, its update and the new head
    assert pretrained["trainable_params"] == pretrained["params"]  # a run without --lora trains everything


def test_checkpoints_and_final_weights_hold_the_update_and_head_alone(base, lora_run):
    last = checkpoint.latest(lora_run)
    saved = checkpoint.SafeReader(last).read_metadata().state_dict_metadata
    model_keys = {k.removeprefix("model.") for k in saved if k.startswith("model.")}
    optim_keys = {k.removeprefix("optim.state.").rpartition(".")[0] for k in saved if k.startswith("optim.state.")}
    assert model_keys == optim_keys == set(UPDATE + HEAD)
    assert set(weights(lora_run)) == set(UPDATE + HEAD)
    size = sum(f.stat().st_size for f in last.iterdir())
    full = sum(f.stat().st_size for f in checkpoint.latest(base).iterdir())
    assert size < 300_000 and 40 * size < full  # a few hundred KB, against the base's full checkpoint
    assert (lora_run / "model.safetensors").stat().st_size < 0.1 * (base / "model.safetensors").stat().st_size


def test_a_resumed_run_equals_the_uninterrupted_one(lora_run, tmp_path):
    """Resumed from its step-2 checkpoint (the update and head, and their optimizer state), onto the base weights
    read again from --init: the same final weights and metrics, bit for bit."""
    run = interrupted_copy(lora_run, 2, tmp_path / "run")
    assert main(["--resume", str(run)]) == 0
    assert bitwise_equal(weights(run), weights(lora_run))
    resumed, uninterrupted = load_json(run / "result.json"), load_json(lora_run / "result.json")
    assert resumed["final_metrics"] == uninterrupted["final_metrics"]
    assert resumed["curves"]["train/loss"] == uninterrupted["curves"]["train/loss"]


def test_the_final_update_on_the_base_runs_weights_gives_the_runs_metrics(base, lora_run):
    """model.safetensors (the update and head) read onto the base run's weights (config.json's --init): the
    test metrics the run reported, and a model whose frozen weights are the base run's."""
    result = load_json(lora_run / "result.json")
    scored = evaluate_run(lora_run)
    assert scored.keys() == result["final_metrics"].keys()
    assert all(abs(scored[k] - result["final_metrics"][k]) < 1e-5 for k in scored)
    model, cfg = load_run(lora_run)
    assert cfg.init == str(base)
    B = model.blocks[0].attn.W_qkv.B
    assert B.abs().max() > 1e-3  # the update moved from its zero start
    state, base_weights = model.state_dict(), weights(base)
    assert torch.equal(state["blocks.0.attn.W_qkv.W_0.weight"], base_weights["blocks.0.attn.W_qkv.weight"])


def test_export_writes_the_merged_model_with_the_unmerged_outputs(base, lora_run, tmp_path, capsys):
    """An update of real size (B random: 4 steps move it little), exported: merged into W_0, and onnxruntime's
    logits are the unmerged torch model's, which differ from the base's."""
    from common.export import main as export_main, session

    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    update = weights(run)
    torch.manual_seed(0)
    save_file({k: torch.randn_like(v) * 0.1 if k.endswith(".B") else v for k, v in update.items()},
              run / "model.safetensors")
    assert export_main(["--run", str(run)]) == 0
    assert "LoRA r=4 merged into the weights it adapts (q,v)" in capsys.readouterr().out
    model, _ = load_run(run)
    idx = torch.randint(0, 104, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        unmerged = model(idx)
        for name, p in model.named_parameters():
            if name.endswith(".B"):
                p.zero_()  # B A = 0: the base's weights alone (and the run's head)
        without = model(idx)
    got = session(run / "model.onnx").run(None, {"idx": idx.numpy()})[0]
    assert np.abs(got - unmerged.numpy()).max() < 1e-4
    assert (unmerged - without).abs().max() > 1e-2  # the update matters


@pytest.fixture(scope="module")
def two_processes(base, tmp_path_factory) -> dict:
    """The LoRA run under torchrun with 2 processes (gloo), with ddp and with fsdp (FSDP2's fully_shard on each
    block and the root: the frozen W_0 sharded with A and B in one unit, gradients reduced for A and B only)."""
    def make(folder):
        torchrun_many([LORA + ["--init", str(base), "--strategy", strategy, "--out", str(folder / strategy),
                               "--results-dir", str(folder / "results")] for strategy in ("ddp", "fsdp")], cwd=folder)

    folder = made_once(tmp_path_factory, "lora-two-processes", make)
    return {strategy: folder / strategy for strategy in ("ddp", "fsdp")}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ddp_and_fsdp_with_the_frozen_base_train_the_one_process_update(strategy, lora_run, two_processes):
    run = two_processes[strategy]
    assert set(weights(run)) == set(UPDATE + HEAD)
    assert max_difference(weights(run), weights(lora_run)) < 1e-5
    losses = [v for _, v in load_json(run / "result.json")["curves"]["train/loss"]]
    one = [v for _, v in load_json(lora_run / "result.json")["curves"]["train/loss"]]
    assert len(losses) == 4 and np.allclose(losses, one, atol=1e-5)
    result = load_json(run / "result.json")
    assert result["strategy"] == strategy and result["world_size"] == 2
    memory = result["memory_per_rank"][0]
    assert memory["grads"] == 4 * result["trainable_params"] / (2 if strategy == "fsdp" else 1)  # fp32, A, B, head


def test_mistakes_are_one_line(base, lora_run, capsys, tmp_path):
    out = ["--out", str(tmp_path / "never")]
    gpt = ["--paper", "gpt", "--flavor", "tiny-classifier", "--init", str(base)] + out
    assert refused(capsys, ["--paper", "resnet", "--lora", "4"] + out) == (
        "train.py: error: --lora adapts the linear projections of attention (W_qkv, or W_q, W_k, W_v); resnet tiny "
        "has no such layer")
    assert refused(capsys, ["--paper", "gpt", "--lora", "4"] + out).startswith(
        "train.py: error: --lora 4 adapts a pre-trained model; give the model to start from: --init RUN_DIR")
    assert refused(capsys, gpt + ["--lora", "0"]) == (
        "train.py: error: argument --lora: expected a positive integer, got '0'")
    assert refused(capsys, gpt + ["--lora", "4", "--lora-targets", "q,W_v"]).startswith(
        "train.py: error: argument --lora-targets: expected a comma list of q, k, v, o, qkv (unknown 'W_v')")
    assert refused(capsys, gpt + ["--lora", "200"]) == (
        "train.py: error: --lora 200: a rank above 128, the smaller side of the 128 x 128 matrices it adapts in gpt "
        "tiny-classifier, is no low-rank update")
    assert refused(capsys, ["--paper", "transformer", "--lora", "4", "--lora-targets", "qkv"] + out) == (
        "train.py: error: --lora-targets qkv: qkv is one update over a fused W_qkv, and the attention of transformer "
        "tiny has W_q, W_k and W_v apart; name them: q,k,v")
    assert "does not go with --tp 2" in refused(capsys, gpt + ["--lora", "4", "--tp", "2"])
    assert refused(capsys, gpt[:4] + ["--init", str(lora_run), "--lora", "4"] + out) == (
        f"train.py: error: --init {lora_run}: a LoRA run, whose model.safetensors holds its update alone; start from "
        f"the run it adapted, {base}")
    assert not (tmp_path / "never").exists()
    validate(resolve(vars(build_parser().parse_args(gpt + ["--lora", "4", "--lora-targets", "qkv,o"]))))  # peft's


def test_an_fsdp_checkpoint_of_the_update_resumes_in_one_process(lora_run, two_processes, tmp_path):
    """fsdp's step-2 checkpoint (the update and head, each rank's shard of them and of their optimizer state)
    resumed in one process, onto the base read again from --init: the one-process run's final update."""
    run = interrupted_copy(two_processes["fsdp"], 2, tmp_path / "run")
    assert main(["--resume", str(run), "--strategy", "single"]) == 0
    assert max_difference(weights(run), weights(lora_run)) < 1e-5
