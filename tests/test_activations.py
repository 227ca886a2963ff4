"""Activation checkpointing (--ac) trains the same weights with fewer bytes kept for backward, and
the bytes a forward keeps are counted exactly."""

import json

import pytest
import torch
import torch.nn as nn

from common.activations import SavedActivations, apply_checkpointing, checkpointed_blocks
from tests.conftest import bitwise_equal, load_json, weights
from train import main


class Chain(nn.Module):
    """Three blocks of Linear 8 -> 16, ReLU, Linear 16 -> 8, ReLU, and a head: a paper's repeated blocks
    in `blocks`."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU())
                                    for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def saved_and_grads(mode: str):
    torch.manual_seed(0)
    model, x = Chain(), torch.randn(5, 8)
    counter = SavedActivations(apply_checkpointing(model, "blocks", mode))
    with counter:
        loss = model(x).square().sum()
    loss.backward()
    return counter.bytes, [p.grad.clone() for p in model.parameters()]


B, FLOAT = 5, 4  # the batch, and the bytes of a float


def test_the_count_is_each_saved_activation_once_without_the_weights():
    # a Linear keeps its input (for its weight's gradient), a ReLU its output, which the next Linear
    # keeps too: one storage, counted once; the weights are not activations; the loss's square keeps
    # the head's output (2 per sample)
    n_bytes, _ = saved_and_grads("none")
    x, per_block = 8, 16 + 8  # the input; each block's hidden ReLU output and its output
    assert n_bytes == (x + 3 * per_block + 2) * B * FLOAT


def test_checkpointed_blocks_keep_only_their_inputs_and_give_the_same_gradients():
    none, grads = saved_and_grads("none")
    full, grads_full = saved_and_grads("full")
    selective, grads_selective = saved_and_grads("selective")
    # full: each block keeps its input (x, then the first two blocks' outputs), the head its input,
    # the loss the head's output
    assert full == (8 + 8 + 8 + 8 + 2) * B * FLOAT
    # selective checkpoints blocks 0 and 2: block 0 keeps x; block 1 keeps its input, hidden and
    # output (block 2's kept input); the head keeps block 2's output, the loss the head's
    assert selective == (8 + 8 + 16 + 8 + 8 + 2) * B * FLOAT
    assert full < selective < none
    for a, b, c in zip(grads, grads_full, grads_selective):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_selective_is_every_other_block_from_the_first():
    model = Chain()
    assert checkpointed_blocks(model, "blocks", "selective") == [model.blocks[0], model.blocks[2]]
    assert checkpointed_blocks(model, "blocks", "full") == list(model.blocks)
    assert checkpointed_blocks(model, "blocks", "none") == []
    with pytest.raises(ValueError, match="choose from: none, full, selective"):
        checkpointed_blocks(model, "blocks", "some")


VIT = ["--paper", "vit", "--max-steps", "3", "--log-every", "1", "--wandb", "disabled"]


@pytest.fixture(scope="module")
def vit_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("ac")
    for mode in ("none", "full"):
        assert main(VIT + ["--ac", mode, "--out", str(out / mode)]) == 0
    return out


def saved_bytes(run_dir) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["memory/saved_activation_bytes"] for row in rows if "train/loss" in row]


def test_ac_trains_the_same_weights_and_keeps_fewer_bytes(vit_runs):
    none, full = vit_runs / "none", vit_runs / "full"
    assert bitwise_equal(weights(full), weights(none))
    b_none, b_full = saved_bytes(none), saved_bytes(full)
    assert len(b_none) == 3 and len(set(b_none)) == 1  # the same shapes every step: the same bytes
    assert b_full[0] * 5 <= b_none[0]  # ViT's blocks keep most of what a step keeps
    result = load_json(full / "result.json")
    assert result["ac"] == "full" and result["memory_per_rank"][0]["activations"] == b_full[0]


def test_ac_refused_for_a_paper_without_blocks(capsys):
    assert main(["--paper", "lenet", "--ac", "full", "--max-steps", "1", "--wandb", "disabled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ac full" in err[0] and "lenet" in err[0]
