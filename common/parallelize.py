"""The one parallelization path: `parallelize` makes a built model ready for its strategy in one fixed
order of small steps, for the Trainer and common.bench_memory alike (torchtitan's
models/llama3/infra/parallelize.py: apply_tp, apply_ac, apply_compile, apply_fsdp).

    split_stages   --pp: this rank's stages of the paper's blocks; the others become placeholders
                   (common.pipeline)
    move           to this process's device
    apply_tp       --tp: the paper's tp_plan split over the mesh's tp dimension (common.tensor_parallel)
    apply_ac       --ac: the blocks that recompute their activations in backward, and the counter of the
                   bytes a forward keeps (common.activations)
    apply_compile  --compile: torch.compile in place, each block where FSDP2 shards each, else the model
    apply_fsdp     FSDP2 `fully_shard` on each block, then the root, over the mesh's data-parallel
                   dimensions (fsdp, hsdp, and data parallelism beside --tp or --pp); or
    apply_ddp      DistributedDataParallel (ddp); or nn.DataParallel (dp); or nothing (single, tp, pp)
    build_pipeline --pp: the schedule that runs a step through the stages

What comes back (common.step) is the wrapped model and how a step runs on it: whole on every rank, or
through the pipeline's stages. The model code never sees any of this. `lay_out` is what comes before: the
strategy that runs, the processes' layout and their device mesh (common.mesh).
"""

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DataParallel, DistributedDataParallel

from common import mesh as meshes, parallel
from common.activations import SavedActivations, apply_checkpointing
from common.mesh import Layout
from common.step import Parallelized, Pipelined, Whole

# The methods besides forward that run a model's parameters (common.decode's protocol): under fsdp they
# gather the root's parameters as forward does. A sharded block is called by its forward inside them.
DECODING_METHODS = ("encode", "decode_step")


@dataclass(frozen=True)
class Options:
    """What `parallelize` reads of a run's configuration, under the flags' names (common.config)."""

    ac: str = "none"  # activation checkpointing: none, full or selective
    compile: bool = False
    compile_mode: str = "default"
    compile_backend: str = "inductor"
    precision: str = "fp32"  # with fsdp and bf16: parameters gathered in bf16, gradients reduced in fp32
    sequence_parallel: bool = False  # with --tp: the positions between the split layers split too
    pp_schedule: str = "1f1b"
    microbatches: int | None = None  # with --pp; None: one per stage's rank
    grad_accum: int = 1  # micro-steps per optimizer step (each micro-step's loss is divided by it)

    @classmethod
    def of(cls, config) -> "Options":
        """The options of a configuration: a TrainConfig, or any object with some of these attributes
        (common.bench_memory's flags); the others keep their defaults."""
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls) if hasattr(config, f.name)})

    @property
    def compile_args(self) -> dict | None:
        """torch.compile's arguments, or None for eager."""
        return dict(mode=self.compile_mode, backend=self.compile_backend) if self.compile else None


def lay_out(config, env: parallel.Env) -> tuple[str, Layout, DeviceMesh | None]:
    """(the strategy that runs, the processes' Layout, their DeviceMesh) for a configuration's --strategy,
    --dp-replicate, --dp-shard, --tp and --pp on these processes. The mesh is None in one process and for
    ddp and fsdp, which need no mesh but the whole group. A fallback (ddp in one process) says so on rank 0."""
    strategy = parallel.resolve_strategy(config.strategy, env.world_size)
    if env.is_main:
        parallel.warn_fallback(config.strategy, strategy)
    if env.world_size == 1:
        return strategy, Layout(), None
    layout = meshes.resolve(strategy, env.world_size, config.dp_replicate, config.dp_shard, config.tp, config.pp)
    grid = meshes.build(layout, env.device.type) if layout.strategy not in ("ddp", "fsdp") else None
    return layout.strategy, layout, grid


def parallelize(model: nn.Module, spec, env: parallel.Env, strategy: str, layout: Layout, mesh, options: Options,
                task) -> Parallelized:
    """This rank's model made ready for the strategy, in the one order every strategy follows.

    Args:
        model: the model as built (on the CPU, whole); changed in place and wrapped.
        spec: the paper's spec: its shard_blocks, tp_plan and pipeline (PipelineChain).
        strategy, layout, mesh: as `lay_out` gives them.
        task: the task (common.tasks): the model's forward and loss in a step.
    """
    if layout.pp > 1:
        split_stages(model, spec, layout, env.rank, options.pp_schedule)
    model = model.to(env.device)
    if layout.tp > 1:
        apply_tp(model, spec, mesh, options.sequence_parallel)
    saved = apply_ac(model, spec.shard_blocks, options.ac)
    sharded = shards(strategy, layout)
    apply_compile(model, options.compile_args, spec.shard_blocks if sharded else None)
    if sharded:
        model = apply_fsdp(model, spec.shard_blocks, layout, mesh, options)
    elif strategy == "ddp":
        model = apply_ddp(model, env)
    elif strategy == "dp":
        model = DataParallel(model)
    eval_model = parallel.eval_module(model)
    if layout.pp > 1:
        pipeline = build_pipeline(model, spec, layout, mesh, env, options, task.loss)
        return Pipelined(model, eval_model, saved, task, options.precision, env.device, pipeline, env.rank)
    replicated = strategy in ("single", "dp", "ddp") and options.precision != "fp16"
    return Whole(model, eval_model, saved, task, options.precision, env.device, options.grad_accum, replicated)


def shards(strategy: str, layout: Layout) -> bool:
    """Whether the data parallelism is FSDP2's: fsdp, hsdp, and any data parallelism beside tensor or pipeline
    parallelism (replicated copies there are FSDP2 on a mesh whose shard dimension is 1)."""
    return strategy in ("fsdp", "hsdp") or (max(layout.tp, layout.pp) > 1 and layout.dp > 1)


def held_blocks(model: nn.Module, shard_blocks: str | None) -> list[nn.Module]:
    """The paper's repeated blocks that this rank holds (not another pipeline stage's placeholders)."""
    blocks = model.get_submodule(shard_blocks) if shard_blocks else ()
    return [block for block in blocks if any(True for _ in block.parameters())]


def split_stages(model: nn.Module, spec, layout: Layout, rank: int, schedule: str) -> None:
    """Keep in the model (in place) the blocks of this rank's stages, each parameter under its name."""
    from common import pipeline  # torch.distributed.pipelining is slow to import: only with --pp

    stages = pipeline.stages_of(layout.pp_rank(rank), layout.pp, schedule)
    pipeline.split(model, spec.shard_blocks, spec.pipeline, stages, layout.pp * pipeline.STAGES_PER_RANK[schedule])


def apply_tp(model: nn.Module, spec, mesh, sequence_parallel: bool) -> None:
    """Split the linear layers of the paper's tp_plan in each block over the mesh's tp ranks, in place."""
    from common import tensor_parallel

    tensor_parallel.apply(model, spec.shard_blocks, spec.tp_plan, mesh["tp"], sequence_parallel)


def apply_ac(model: nn.Module, shard_blocks: str | None, mode: str) -> SavedActivations:
    """Make the blocks `mode` names recompute their activations in backward (in place); returns the counter
    of the bytes a forward keeps for backward, which counts the inputs those blocks keep."""
    return SavedActivations(apply_checkpointing(model, shard_blocks, mode))


def apply_compile(model: nn.Module, compile_args: dict | None, shard_blocks: str | None) -> None:
    """torch.compile in place, so that parameter names keep no `_orig_mod.`: each held block of
    `shard_blocks` (FSDP2's units, whose gathers then stay outside the graphs), else the whole model."""
    if compile_args is None:
        return
    for block in held_blocks(model, shard_blocks):
        block.compile(**compile_args)
    if not shard_blocks:
        model.compile(**compile_args)


def apply_fsdp(model: nn.Module, shard_blocks: str | None, layout: Layout, mesh, options: Options) -> nn.Module:
    """FSDP2: `fully_shard` on each held block, then on the root, over the mesh's data-parallel dimensions
    (the whole group where there is no mesh). With --tp a strided (fused q, k, v) weight is sharded by its
    columns; the methods a seq2seq model decodes through gather the root's parameters as forward does."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if options.precision == "bf16"
          else MixedPrecisionPolicy())
    placement = None
    if layout.tp > 1:
        from common.tensor_parallel import fsdp_placement as placement
    dp_mesh = meshes.data_parallel_mesh(mesh, layout) if mesh is not None else None
    fsdp = dict(mesh=dp_mesh, mp_policy=mp, shard_placement_fn=placement)  # fully_shard's arguments
    for block in held_blocks(model, shard_blocks):
        fully_shard(block, **fsdp)
    model = fully_shard(model, **fsdp)
    for method in DECODING_METHODS:
        if callable(getattr(model, method, None)):
            register_fsdp_forward_method(model, method)
    return model


def apply_ddp(model: nn.Module, env: parallel.Env) -> nn.Module:
    """DistributedDataParallel over every process: gradients all-reduced in backward."""
    return DistributedDataParallel(model, device_ids=[env.device] if env.device.type == "cuda" else None)


def build_pipeline(model: nn.Module, spec, layout: Layout, mesh, env: parallel.Env, options: Options, loss):
    """This rank's stages and the schedule that runs a step through them (common.pipeline.Pipeline)."""
    from common import pipeline

    return pipeline.Pipeline(model, spec.pipeline, layout, mesh, env.rank, env.device, options.pp_schedule,
                             options.microbatches or layout.pp, loss, options.grad_accum)
