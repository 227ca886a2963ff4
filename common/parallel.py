"""Processes and devices, and what every strategy shares once the model is wrapped: the strategy
that runs, unwrapping, gradient sync and clipping over shards, the full state dict, and collectives.

The strategies (the wrapping itself is common.parallelize's, in one order for all of them):

    single  one process, one device
    dp      nn.DataParallel over every visible CUDA device, in one process
    ddp     DistributedDataParallel, one process per device (torchrun)
    fsdp    FSDP2: `fully_shard` on each block the paper names, then on the root
    tp      tensor parallel (`--tp N`): the linear layers of the paper's `tp_plan` split over the
            processes (common.tensor_parallel); the ranks of a group read the same batches
    hsdp    FSDP2 on a 2-D mesh: replicated across --dp-replicate, sharded within --dp-shard
    pp      pipeline parallel (`--pp N`): each rank's model holds its stages' blocks
            (common.pipeline, which cuts it before the wrapping)

and tensor or pipeline parallel beside data parallel (fsdp+tp, ddp+tp, hsdp+tp, fsdp+pp, ddp+pp):
the layers split first, then FSDP2 over the data-parallel dimensions of the mesh (common.mesh);
beside a pipeline, replicated copies (ddp+pp) are FSDP2 too, on a mesh whose shard dimension is 1.
"""

import contextlib
import sys
import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from common.choices import STRATEGIES
from common.dtensor import is_dtensor


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
        # torchrun's store can outlive a restart of the workers (static rendezvous), and with it the
        # addresses the failed attempt published; keys prefixed by the attempt keep the new group clean
        store, _, _ = next(dist.rendezvous("env://"))
        store = dist.PrefixStore(f"attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
        cuda = device.type == "cuda"
        dist.init_process_group(backend="nccl" if cuda else "gloo", store=store, rank=rank, world_size=world_size,
                                device_id=device if cuda else None)
    return Env(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def resolve_strategy(strategy: str, world_size: int, cuda_devices: int | None = None) -> str:
    """The strategy that will run. `auto` is ddp with more than one process, else single;
    ddp and fsdp in one process, and dp with fewer than two GPUs, run as single."""
    cuda_devices = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy '{strategy}'; choose from: {', '.join(STRATEGIES)}")
    if world_size > 1 and strategy in ("single", "dp"):
        raise ValueError(f"--strategy {strategy} runs in one process, but {world_size} were launched; use ddp or fsdp")
    if strategy == "auto":
        return "ddp" if world_size > 1 else "single"
    if strategy == "dp" and cuda_devices < 2:
        return "single"
    if world_size == 1 and strategy in ("ddp", "fsdp"):
        return "single"
    return strategy


def warn_fallback(requested: str, strategy: str) -> None:
    """One warning line when the strategy asked for cannot run here."""
    if requested in ("dp", "ddp", "fsdp") and strategy != requested:
        why = "fewer than two CUDA devices are visible" if requested == "dp" else "only one process was launched"
        warnings.warn(f"--strategy {requested} runs as single: {why}", stacklevel=2)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside DataParallel or DDP (FSDP2 and in-place compile keep it as it is)."""
    return model.module if isinstance(model, (DataParallel, DistributedDataParallel)) else model


def eval_module(model: nn.Module) -> nn.Module:
    """What evaluation calls: the model without DDP (no gradient sync), but still FSDP (its gathers)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def gradient_sync(model: nn.Module, enabled: bool):
    """Within a non-final accumulation micro-step the gradient reduction is skipped."""
    fsdp = sys.modules.get("torch.distributed.fsdp")  # imported by common.parallelize where it shards a model
    if fsdp is not None and isinstance(model, fsdp.FSDPModule):
        model.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()
    if not enabled and isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def grad_norm(parameters) -> torch.Tensor:
    """The 2-norm of all these parameters' gradients together (gathered over their shards)."""
    return _grad_norm([p.grad for p in parameters if p.grad is not None])


def clip_grad_norm_(parameters, max_norm: float, counted=None, group=None, total_norm=None) -> torch.Tensor:
    """Clip to a global gradient norm; with sharded (DTensor) gradients the norm is the
    norm of the whole gradient, gathered over the shards, not of the local shard.

    Args:
        counted: the parameters whose gradients make up the norm (default: all of them).
        group: the processes whose parameters are the rest of the model (a pipeline's stages):
            the norm is over all of theirs.
        total_norm: the norm, where the caller has it already (grad_norm of the same parameters).
    """
    parameters = [p for p in parameters if p.grad is not None]
    if total_norm is None:
        total_norm = grad_norm(parameters if counted is None else counted)
    if group is not None:
        square = total_norm.detach().double() ** 2
        dist.all_reduce(square, group=group)
        total_norm = square.sqrt().to(total_norm.dtype)
    meshes = {}  # a foreach kernel takes whole tensors, or DTensors of one mesh, not a mix
    for p in parameters:
        meshes.setdefault(p.grad.device_mesh if is_dtensor(p.grad) else None, []).append(p)
    for group_ in meshes.values():
        torch.nn.utils.clip_grads_with_norm_(group_, max_norm, total_norm, foreach=True)
    return total_norm


def _grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all these gradients together, gathered over their shards."""
    if not grads:
        return torch.zeros(())
    if len({g.device_mesh if is_dtensor(g) else None for g in grads}) == 1:  # all whole, or fsdp's
        total_norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        if is_dtensor(total_norm):
            total_norm = total_norm.full_tensor()
    else:  # tensor parallel: some whole or split on other meshes; each one's norm, then all's
        norms = [torch.linalg.vector_norm(g) for g in grads]
        total_norm = torch.linalg.vector_norm(torch.stack([n.full_tensor() if is_dtensor(n) else n
                                                           for n in norms]))
    return total_norm


def full_state_dict(model: nn.Module, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """The whole, unwrapped state dict on CPU (on rank 0; other ranks get an empty dict).
    Every rank must call it: under fsdp it gathers the shards. trainable_only: without the frozen
    parameters (a LoRA run's base weights)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # (slow to import)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
    return get_model_state_dict(unwrap(model), options=options)


def local_bytes(tensors) -> int:
    """Bytes this rank holds for these tensors (its own shard of a DTensor)."""
    total = 0
    for t in tensors:
        t = t.to_local() if is_dtensor(t) else t
        total += t.numel() * t.element_size()
    return total


def memory_per_rank(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """This rank's bytes of parameters, gradients and optimizer state."""
    params = list(unwrap(model).parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    sizes = {
        "params": local_bytes(params),
        "grads": local_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": local_bytes(state),
    }
    return sizes | {"total": sum(sizes.values())}


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(value: int) -> int:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.int64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def all_reduce_max_ints(values: list[int]) -> list[int]:
    """The element-wise maximum of a few integers over every rank, in one all-reduce."""
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.int64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def all_gather_object(obj) -> list:
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, src: int = 0):
    """Rank `src`'s value of a picklable object, on every rank."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
