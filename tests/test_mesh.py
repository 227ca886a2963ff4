"""One device mesh: --dp-replicate, --dp-shard and --tp multiply to the processes, and every layout
of 4 gloo processes (FSDP x TP, HSDP) trains the weights one process trains."""

import pytest

from common.mesh import Layout, resolve
from tests.conftest import interrupted_copy, load_json, made_once, max_difference, torchrun_many, weights
from train import main

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

# clipping small enough to act on every step, two micro-steps a step
FLAGS = ["--paper", "vit", "--max-steps", "4", "--batch-size", "32", "--grad-accum", "2", "--clip-grad", "0.3",
         "--ckpt-every", "1", "--keep-ckpts", "4", "--wandb", "disabled"]
LAYOUTS = {
    "fsdp+tp": ["--dp-shard", "2", "--tp", "2"],
    "hsdp": ["--dp-replicate", "2", "--dp-shard", "2"],
    # "ddp+tp": ["--dp-replicate", "2", "--tp", "2"] passed here until commit 0ae3cd1 (out for the suite's time)
}


def test_layouts_from_the_flags():
    assert resolve("ddp", 4) == Layout(dp_replicate=4) and resolve("ddp", 4).strategy == "ddp"
    assert resolve("fsdp", 4) == Layout(dp_shard=4) and resolve("fsdp", 4).strategy == "fsdp"
    assert resolve("ddp", 4, tp=2) == Layout(dp_replicate=2, tp=2)
    assert resolve("fsdp", 4, tp=2).strategy == "fsdp+tp"
    hsdp = resolve("ddp", 4, dp_replicate=2, dp_shard=2)
    assert hsdp.strategy == "hsdp" and hsdp.dp == 4 and hsdp.describe() == "dp_replicate 2 x dp_shard 2"
    two_d = resolve("ddp", 8, dp_replicate=2, dp_shard=2, tp=2)
    assert two_d.strategy == "hsdp+tp" and [two_d.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match=r"^--dp-replicate 1 x --dp-shard 2 x --tp 1 = 2 processes, but 4 were"):
        resolve("ddp", 4, dp_shard=2)
    with pytest.raises(ValueError, match="--tp 3 needs a multiple of 3 processes"):
        resolve("ddp", 4, tp=3)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    def make(out):
        assert main(FLAGS + ["--out", str(out / "single")]) == 0

    run = made_once(tmp_path_factory, "mesh-single", make) / "single"
    return run


@pytest.fixture(scope="module")
def four(tmp_path_factory) -> dict:
    def make(out):
        torchrun_many([FLAGS + flags + ["--out", str(out / name)] for name, flags in LAYOUTS.items()], cwd=out, nproc=4)

    out = made_once(tmp_path_factory, "mesh-four", make)
    return {name: out / name for name in LAYOUTS}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_four_processes_train_the_single_process_weights(name, single, four):
    run = four[name]
    assert max_difference(weights(run), weights(single)) < 1e-5
    result, one = load_json(run / "result.json"), load_json(single / "result.json")
    assert result["strategy"] == name and result["world_size"] == 4
    assert result["final"] == pytest.approx(one["final"], abs=1e-6)
    held, whole = result["memory_per_rank"][0]["params"], one["memory_per_rank"][0]["params"]
    assert held < 0.75 * whole if name != "hsdp" else held < 0.55 * whole  # split 2 ways, and sharded 2 ways


def test_checkpoints_move_between_layouts(single, four, tmp_path):
    """hsdp -> ddp; and fsdp x tp on 4 processes -> fsdp on 2 -> one process: each resume continues the
    uninterrupted run. (The second chain began with a fresh --tp 2 run on 2 processes until commit 9e621dd;
    it starts from the fsdp x tp run now, which shards by tp and fsdp at once, for the suite's time.)"""
    ddp = interrupted_copy(four["hsdp"], 2, tmp_path / "ddp")
    fsdp = interrupted_copy(four["fsdp+tp"], 1, tmp_path / "fsdp")
    torchrun_many([["--resume", str(ddp), "--dp-replicate", "2", "--dp-shard", "1"],
                   ["--resume", str(fsdp), "--tp", "1", "--strategy", "fsdp"]], cwd=tmp_path)
    assert load_json(ddp / "result.json")["strategy"] == "ddp"
    assert max_difference(weights(ddp), weights(single)) < 1e-5

    assert load_json(fsdp / "result.json")["strategy"] == "fsdp"
    assert load_json(fsdp / "result.json")["world_size"] == 2
    one = interrupted_copy(fsdp, 3, tmp_path / "one")
    assert main(["--resume", str(one), "--dp-shard", "1", "--tp", "1"]) == 0
    assert load_json(one / "result.json")["world_size"] == 1
    for run in (fsdp, one):
        assert max_difference(weights(run), weights(single)) < 1e-5
