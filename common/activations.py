"""Activation checkpointing, and the bytes a forward keeps for backward.

Autograd keeps, from every forward, the tensors its backward will read: the activations. With
`--ac full` each of the paper's repeated blocks (its `shard_blocks`) keeps only its input and
recomputes the rest in backward; with `--ac selective` every other block does (the first, the
third, ...). The arithmetic is the same, so the weights a run trains are the same (the
recomputation replays the forward's random state, dropout included); memory is traded for a
second forward of the checkpointed blocks.

`SavedActivations` counts what a forward keeps, exactly: it sees every tensor autograd saves
(`torch.autograd.graph.saved_tensors_hooks`) and adds each distinct storage once, leaving out the
parameters' own storages (a weight a layer saves is not an activation), plus the inputs that
checkpointed blocks keep for their recomputation; and it sees each let go, so that it reports the
peak (a pipeline's 1F1B schedule frees a microbatch's activations before the last forward). The
trainer logs it for every run as `memory/saved_activation_bytes`.
"""

import functools
import weakref

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from common.choices import AC_MODES
from common.dtensor import is_dtensor


def checkpointed_blocks(model: nn.Module, shard_blocks: str | None, mode: str) -> list[nn.Module]:
    """The blocks that recompute their activations under `mode`: every block (full), every other
    block from the first (selective), none (none)."""
    if mode not in AC_MODES:
        raise ValueError(f"unknown activation checkpointing '{mode}'; choose from: {', '.join(AC_MODES)}")
    if mode == "none":
        return []
    if not shard_blocks:
        raise ValueError("activation checkpointing needs the paper's repeated blocks (its shard_blocks)")
    blocks = list(model.get_submodule(shard_blocks))
    return blocks if mode == "full" else blocks[::2]


def apply_checkpointing(model: nn.Module, shard_blocks: str | None, mode: str) -> list[nn.Module]:
    """Make the blocks `mode` names recompute their activations in backward, in place: each block's
    forward runs inside torch.utils.checkpoint (non-reentrant, as torch.compile traces it), and its
    parameter names stay as they are. Returns the blocks."""
    blocks = checkpointed_blocks(model, shard_blocks, mode)
    for block in blocks:
        block.forward = _recomputed(block.forward)
    return blocks


def _recomputed(forward):
    def run(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return run


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if is_dtensor(t) else t


def _is_parameter(t: torch.Tensor) -> bool:
    """A leaf that requires grad (a parameter, or under fsdp its gathered copy), or a view of one."""
    base = t._base if t._base is not None else t
    return base.is_leaf and base.requires_grad


class _Saved:
    """What autograd keeps in place of a saved tensor while the counter runs: the tensor, and the
    release of its count when autograd lets it go (after the backward that read it)."""

    __slots__ = ("tensor", "release")

    def __init__(self, tensor: torch.Tensor, release):
        self.tensor, self.release = tensor, release

    def __del__(self):
        self.release()


class SavedActivations:
    """Counts the bytes that the forwards run inside it keep for backward, at their peak.

    Use one per step: `with counter: loss = forward(...)` (a pipeline's step, forwards and backwards
    interleaved, runs inside it whole), then `counter.bytes`. Each distinct storage counts once, with
    all its bytes (what stays allocated), from the forward that saves it until the backward that
    frees it; `bytes` is the largest sum at any moment. Parameters do not count; the inputs of
    `checkpointed` blocks (kept to recompute them) do, while they live.
    """

    def __init__(self, checkpointed: list[nn.Module] = ()):
        self.live: dict[int, list[int]] = {}  # storage -> [bytes, references held]
        self.current = self.peak = 0
        self._hooks = None
        for block in checkpointed:
            block.register_forward_pre_hook(self._block_inputs, with_kwargs=True)

    @property
    def bytes(self) -> int:
        return self.peak

    def _hold(self, t: torch.Tensor):
        """Count t's storage (once, however many hold it); returns what lets this hold go."""
        storage = _local(t).untyped_storage()
        key = storage.data_ptr()
        entry = self.live.setdefault(key, [storage.nbytes(), 0])
        if entry[1] == 0:
            self.current += entry[0]
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        return functools.partial(self._release, key, entry)

    def _release(self, key: int, entry: list[int]) -> None:
        if self.live.get(key) is not entry:  # counted before the counter was last restarted
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[key]

    def _pack(self, t: torch.Tensor):
        return t if _is_parameter(t) else _Saved(t, self._hold(t))

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def _block_inputs(self, module, args, kwargs):
        if self._hooks is not None:
            for value in (*args, *kwargs.values()):
                if isinstance(value, torch.Tensor) and value.requires_grad:
                    weakref.finalize(value, self._hold(value))

    def __enter__(self):
        self.live, self.current, self.peak = {}, 0, 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        hooks, self._hooks = self._hooks, None
        return hooks.__exit__(*exc)
