"""Processes, devices and model wrapping, in one place and one order.

The order is fixed: build the model, move it to the device, compile it, then
wrap it for the strategy. The model code itself never sees any of this.
"""

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class Env:
    """Where this process stands: its rank, the number of processes, its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup() -> Env:
    """Join the process group when launched by torchrun, and pick this process's device.

    CUDA is used where it exists (`cuda:LOCAL_RANK`, nccl); otherwise the CPU (gloo).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", device_id=device
                                if device.type == "cuda" else None)
    return Env(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def resolve_strategy(strategy: str, world_size: int) -> str:
    """`auto` is ddp with more than one process, else single; ddp in one process runs as single."""
    if strategy == "single" and world_size > 1:
        raise ValueError(f"--strategy single runs one process, but {world_size} were launched; use ddp")
    if world_size == 1:
        return "single"
    return "ddp" if strategy == "auto" else strategy


def parallelize(model: nn.Module, strategy: str, env: Env, compile: bool = False) -> nn.Module:
    """Move, compile, wrap: the one order every strategy follows."""
    model = model.to(env.device)
    if compile:
        model = torch.compile(model)
    if strategy == "ddp":
        model = DistributedDataParallel(model, device_ids=[env.device] if env.device.type == "cuda" else None)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside any wrapper (DDP's `module.`, compile's `_orig_mod.`)."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def unwrap_ddp(model: nn.Module) -> nn.Module:
    """The module DDP wraps, still compiled: for evaluation, which needs no gradient sync and
    lets ranks hold evaluation shards of different lengths."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def no_sync(model: nn.Module, skip: bool):
    """Within a non-final micro-step, DDP's gradient all-reduce is skipped."""
    if skip and isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_object(obj, src: int = 0):
    """Rank `src`'s value of a picklable object, on every rank."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
