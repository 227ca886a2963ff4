"""Tensor parallelism (--tp 2 on 2 gloo processes) trains the weights one process trains, for every
paper with a tp_plan, holds about half of each split layer per rank, resumes in one process, and
is refused in one line where it cannot run."""

import pytest

from papers import get_paper, list_papers
from tests.conftest import interrupted_copy, load_json, made_once, max_difference, refusal, torchrun_many, weights
from train import main

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

# and vit: its plan trains under fsdp x tp in test_mesh.py (--tp 2 here until 5963eb2), and deit's is vit's plan on
# vit's blocks (its two tokens are before the blocks). Swin's plan also splits an nn.Embedding (its relative position
# bias tables, by heads); its two runs cost about 45 s of CPU time
PAPERS = ("gpt", "swin", "transformer", "bert")
SEQUENCE_PARALLEL = ("gpt",)  # pre-norm blocks (ViT's too: checked by this test until commit 0ae3cd1)
# clipping small enough to act on every step; a checkpoint after step 2 for the resume
# a fixed 64 of the test split (--eval-samples): each run evaluates, which decoding the Transformer's whole split made
# most of its time
FLAGS = ["--max-steps", "4", "--batch-size", "16", "--clip-grad", "0.3", "--ckpt-every", "2", "--wandb", "disabled",
         "--eval-samples", "64"]
# GPT at 32 positions, as test_pipeline.py's (the fixture's time is mostly its runs' start-up: 88.6 s at 256
# positions against 86.4 s at 32, side by side under load); BERT without dropout, whose masks each rank draws
# for its own heads (with dropout 0.1 the two layouts differed by 1.1e-4 after 4 steps; without, by 5.6e-9)
SIZE = {"gpt": ["--block-size", "32"], "bert": ["--model-kwargs", "dropout=0.0"]}


def test_the_papers_with_a_plan():
    assert sorted(name for name in list_papers() if get_paper(name).tp_plan) == sorted(PAPERS + ("vit", "deit"))
    assert get_paper("deit").tp_plan == get_paper("vit").tp_plan


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Each paper trained 4 steps in one process and with --tp 2 on 2 processes."""
    def make(out):
        launches = []  # the two-process runs, in one launch (tests/launch_many.py)
        for paper in PAPERS:
            flags = ["--paper", paper, *SIZE.get(paper, []), *FLAGS]
            assert main([*flags, "--out", str(out / f"{paper}-single")]) == 0
            launches.append([*flags, "--tp", "2", "--out", str(out / f"{paper}-tp")])
        for paper in SEQUENCE_PARALLEL:
            launches.append(["--paper", paper, *SIZE.get(paper, []), *FLAGS, "--tp", "2", "--sequence-parallel",
                             "--out", str(out / f"{paper}-sp")])
        torchrun_many(launches, cwd=out)

    out = made_once(tmp_path_factory, "tp", make)
    return {paper: (out / f"{paper}-single", out / f"{paper}-tp", out / f"{paper}-sp") for paper in PAPERS}


@pytest.mark.parametrize("paper", PAPERS)
def test_tp_trains_the_single_process_weights(paper, runs):
    single, tp, _ = runs[paper]
    assert max_difference(weights(tp), weights(single)) < 1e-5
    one, two = load_json(single / "result.json"), load_json(tp / "result.json")
    assert two["strategy"] == "tp" and two["world_size"] == 2
    assert two["final_metrics"] == pytest.approx(one["final_metrics"], rel=1e-6, abs=1e-6)
    # each rank holds half of every split layer (most of a tiny Transformer's weights) and the rest whole
    held, whole = two["memory_per_rank"][0]["params"], one["memory_per_rank"][0]["params"]
    assert 0.5 * whole < held < 0.75 * whole


@pytest.mark.parametrize("paper", SEQUENCE_PARALLEL)
def test_sequence_parallel_trains_the_single_process_weights_with_fewer_saved_bytes(paper, runs):
    single, tp, sp = runs[paper]
    assert max_difference(weights(sp), weights(single)) < 1e-5
    # the norms' inputs and outputs, the residual adds and the dropouts keep a share of the positions (ViT's
    # 17 split 9 and 8: rank 0 keeps the larger); the gathered inputs of the column-wise layers stay whole
    saved = [load_json(run / "result.json")["memory_per_rank"][0]["activations"] for run in (tp, sp)]
    assert saved[1] < saved[0]


@pytest.mark.parametrize("paper", ["gpt"])
def test_a_tp_checkpoint_resumes_in_one_process(paper, runs, tmp_path):
    single, tp, _ = runs[paper]
    run = interrupted_copy(tp, 2, tmp_path / "run")
    assert main(["--resume", str(run), "--tp", "1"]) == 0
    assert load_json(run / "result.json")["world_size"] == 1
    assert max_difference(weights(run), weights(single)) < 1e-5


def test_tp_refusals(capsys):
    assert main(["--paper", "lenet", "--tp", "2", "--wandb", "disabled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lenet has none" in err[0] and "gpt, swin, transformer, vit" in err[0]
    assert main(["--paper", "gpt", "--tp", "2", "--wandb", "disabled"]) == 2  # one process launched
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torchrun --nproc_per_node 2" in err[0]
    message = refusal(dict(paper="gpt", dataset="pydoc", tp=3), world_size=3)  # 4 heads of 32, 128 wide: not in 3
    assert "do not divide by 3" in message and "\n" not in message
    message = refusal(dict(paper="transformer", dataset="dates", tp=2, sequence_parallel=True), world_size=2)
    assert "transformer's plan names none" in message
    message = refusal(dict(paper="gpt", flavor="GPT", dataset="pydoc", tp=2, sequence_parallel=True), world_size=2)
    assert "GPT's blocks normalise after their sub-layers (post-norm)" in message
    message = refusal(dict(paper="gpt", dataset="pydoc", sequence_parallel=True), world_size=1)
    assert "add --tp N" in message
    message = refusal(dict(paper="gpt", dataset="pydoc", dp_shard=2, tp=2), world_size=2)
    assert message == ("--dp-replicate 1 x --dp-shard 2 x --tp 2 = 4 processes, but 2 were launched "
                       "(torchrun --nproc_per_node 4)")
