"""The processes as one device mesh: pipeline, data parallel (replicated and sharded), tensor
parallel, and their products, with torchtitan's names.

    --dp-replicate R   copies of the model that average their gradients (DDP; across machines)
    --dp-shard S       ranks that shard parameters, gradients and optimizer state (FSDP2)
    --tp T             ranks that split each block's layers (common.tensor_parallel)
    --pp P             ranks along a pipeline of the blocks (common.pipeline)

P x R x S x T is the number of processes; the mesh's dimensions are in that order, so that the T
ranks of a tensor-parallel group are neighbours (one machine), then the S of a shard group, and the
stages of a pipeline the farthest apart (a stage sends one activation per microbatch). `--strategy`
is the short form of the common layouts: ddp is R = all, fsdp is S = all; with R and S both above
1 the run is HSDP (replicate across, shard within), with T above 1 FSDP x TP (2-D) or DDP x TP,
with P above 1 PP x FSDP or PP x DDP (each stage's ranks data parallel among themselves).
"""

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from common.choices import MESH_DIMS as DIMS


@dataclass(frozen=True)
class Layout:
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        """The ranks that read different batches."""
        return self.dp_replicate * self.dp_shard

    def pp_rank(self, rank: int) -> int:
        """This rank's place along the pipeline (0: the first stage)."""
        return rank // (self.world_size // self.pp)

    def dp_rank(self, rank: int) -> int:
        return rank % (self.dp * self.tp) // self.tp

    @property
    def strategy(self) -> str:
        """single, ddp, fsdp, hsdp, tp, pp, or a data-parallel strategy +tp or +pp."""
        if self.dp_replicate > 1 and self.dp_shard > 1:
            data = "hsdp"
        else:
            data = "fsdp" if self.dp_shard > 1 else "ddp" if self.dp_replicate > 1 else ""
        model = ("tp" if self.tp > 1 else "", "pp" if self.pp > 1 else "")
        return "+".join(part for part in (data, *model) if part) or "single"

    def describe(self) -> str:
        """The sizes above 1, as the flags name them: 'dp_shard 2 x tp 2'."""
        return " x ".join(f"{d} {getattr(self, d)}" for d in DIMS if getattr(self, d) > 1) or "one process"


def resolve(strategy: str, world_size: int, dp_replicate: int | None = None, dp_shard: int | None = None,
            tp: int = 1, pp: int = 1) -> Layout:
    """The layout the flags ask for. Where neither --dp-replicate nor --dp-shard is given, the
    processes left after --tp and --pp are data parallel as --strategy says (fsdp: sharded; else
    replicated). Raises ValueError, in one line, where the product is not the number of processes or
    the combination is not supported."""
    if tp > 1 and pp > 1:
        raise ValueError(f"--tp {tp} with --pp {pp} is not supported; use one of them (each with data parallelism)")
    if dp_replicate is None and dp_shard is None:
        model = tp * pp
        if world_size % model:
            flag = f"--tp {tp}" if tp > 1 else f"--pp {pp}"
            raise ValueError(f"{flag} needs a multiple of {model} processes, but {world_size} were launched "
                             f"(torchrun --nproc_per_node {model})")
        rest = world_size // model
        return (Layout(dp_shard=rest, tp=tp, pp=pp) if strategy == "fsdp"
                else Layout(dp_replicate=rest, tp=tp, pp=pp))
    if strategy not in ("auto", "single", "ddp", "fsdp"):
        raise ValueError(f"--strategy {strategy} runs one process; the mesh flags lay out several")
    layout = Layout(dp_replicate or 1, dp_shard or 1, tp, pp)
    if layout.world_size != world_size:
        sizes = " x ".join(f"--{d.replace('_', '-')} {getattr(layout, d)}" for d in DIMS if d != "pp" or pp > 1)
        raise ValueError(f"{sizes} = {layout.world_size} processes, but {world_size} were launched "
                         f"(torchrun --nproc_per_node {layout.world_size})")
    return layout


def build(layout: Layout, device_type: str) -> DeviceMesh | None:
    """The mesh of the processes, dimensions named as the flags; None in one process."""
    if layout.world_size == 1 or not dist.is_initialized():
        return None
    return init_device_mesh(device_type, tuple(getattr(layout, d) for d in DIMS), mesh_dim_names=DIMS)


def data_parallel_mesh(mesh: DeviceMesh, layout: Layout) -> DeviceMesh:
    """The data-parallel dimensions as FSDP2 takes them: 1-D (shard), or 2-D (replicate, shard) for HSDP
    and for replicated copies beside tensor parallelism."""
    return mesh["dp_shard"] if layout.dp_replicate == 1 else mesh["dp_replicate", "dp_shard"]


def data_parallel_group(mesh: DeviceMesh | None, layout: Layout):
    """The process group of the ranks that read different batches with this one (for metrics that
    gather them); None where that is every process."""
    if mesh is None or (layout.tp == 1 and layout.pp == 1):
        return None
    return mesh["dp_replicate", "dp_shard"]._flatten("dp").get_group()


def check(cfg, world_size: int, strategy: str, resuming: bool = False) -> None:
    """The mesh's checks of a config (common.config.validate asks them): the layout fits the processes
    launched under the strategy that will run (common.parallel.resolve_strategy), and the global batch
    divides over the processes that read different data, the accumulation steps and a pipeline's
    microbatches. `resuming`: a pipeline's run may resume in one process."""
    from common.errors import ConfigError

    if world_size > 1 or cfg.tp > 1 or cfg.pp > 1 or (cfg.dp_replicate or 1) > 1 or (cfg.dp_shard or 1) > 1:
        try:
            resolve(strategy, world_size, cfg.dp_replicate, cfg.dp_shard, cfg.tp, cfg.pp)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if cfg.microbatches is not None and cfg.pp == 1 and not resuming:
        raise ConfigError("--microbatches cuts each batch for a pipeline's stages; add --pp N")
    readers = max(1, world_size // (cfg.tp * cfg.pp))  # the processes that read different data
    microbatches = (cfg.microbatches or cfg.pp) if cfg.pp > 1 else 1
    shards = readers * cfg.grad_accum * microbatches
    if cfg.batch_size != "auto" and cfg.batch_size % shards:
        below, above = cfg.batch_size // shards * shards, (cfg.batch_size // shards + 1) * shards
        nearest = f"{below} or {above}" if below else f"{above}"
        pieces = f" x {microbatches} microbatches" if cfg.pp > 1 else ""
        raise ConfigError(f"batch size {cfg.batch_size} does not divide over {readers} process(es) x "
                          f"{cfg.grad_accum} accumulation step(s){pieces}; use a multiple of {shards}, such as "
                          f"{nearest}")
