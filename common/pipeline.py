"""Pipeline parallelism (`--pp N`): the paper's repeated blocks cut into stages, each on its own
ranks, and each step's batch cut into microbatches that flow through them.

    --pp N               ranks along the pipeline; stage s holds a contiguous share of the blocks,
                         the first also what comes before them (the embedding), the last what comes
                         after (the head) and the loss
    --pp-schedule        gpipe: every microbatch's forward, then every backward (all M microbatches'
                         activations live at once); 1f1b: once the pipe is full, one forward then one
                         backward (at most N live on the first stage); interleaved: 1F1B over two
                         stages per rank (stage s on rank s mod N), a smaller bubble for more messages
    --microbatches M     pieces of each rank's batch (default N)

A paper takes --pp where its forward is a chain of its blocks (PaperSpec.pipeline). Each rank keeps
one copy of the model with what its stages do not hold taken out: the other blocks replaced by
empty placeholders, so that every parameter keeps its name (checkpoints, the optimizer and the
final weights read as one process's), and the embedding or head set to None. Its forward runs one
stage: `model(h, stage=s)`. torch.distributed.pipelining's schedules drive the stages; each
microbatch's loss is divided by M (and by --grad-accum), so that the gradients are those of one
process accumulating the same microbatches. A weight both ends use (GPT's tied W_e) lives on the
first and the last stage, and its gradient is summed between them before the optimizer's step.

Evaluation runs through the stages too, a batch at a time: each stage receives its input from the
previous one, runs, and sends on; the last computes the metrics.
"""

import functools

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.tensor import DTensor

from common.choices import PP_SCHEDULES as SCHEDULES, STAGES_PER_RANK
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what a stage may send on (autocast's too)


def stage_bounds(n_blocks: int, n_stages: int) -> list[tuple[int, int]]:
    """[start, stop) of each stage's blocks: contiguous, as even as can be (earlier stages the fewer)."""
    if n_blocks < n_stages:
        raise ValueError(f"{n_stages} pipeline stages need at least {n_stages} blocks; the model has {n_blocks}")
    return [(s * n_blocks // n_stages, (s + 1) * n_blocks // n_stages) for s in range(n_stages)]


def stages_of(pp_rank: int, pp: int, schedule: str) -> list[int]:
    """The stages a rank runs: its own (gpipe, 1f1b), or every pp-th from its own (interleaved)."""
    return [pp_rank + v * pp for v in range(STAGES_PER_RANK[schedule])]


class Placeholder(nn.Module):
    """Where a block of another stage was: no parameters, so that the blocks keep their indices."""

    def forward(self, x):
        raise RuntimeError("a pipeline stage ran a block that another stage holds")


def _run_stage(model: nn.Module, blocks: nn.ModuleList, chain, bounds, x: torch.Tensor, stage: int) -> torch.Tensor:
    h = chain.embed(model, x) if stage == 0 else x
    for i in range(*bounds[stage]):
        out = blocks[i](h)
        h = out[0] if isinstance(out, tuple) else out  # GPT's (h, kv), ResNet's (x, mask)
    return chain.readout(model, h) if stage == len(bounds) - 1 else h


def split(model: nn.Module, shard_blocks: str, chain, stages: list[int], n_stages: int) -> nn.Module:
    """Keep in `model` (in place) what `stages` hold, and make its forward run one of them,
    `model(h, stage=s)`. Returns the model."""
    blocks = model.get_submodule(shard_blocks)
    bounds = stage_bounds(len(blocks), n_stages)
    held = {i for s in stages for i in range(*bounds[s])}
    for i in range(len(blocks)):
        if i not in held:
            blocks[i] = Placeholder()
    kept = set(chain.first if 0 in stages else ()) | set(chain.last if n_stages - 1 in stages else ())
    for name in (set(chain.first) | set(chain.last)) - kept:
        setattr(model, name, None)
    model.forward = functools.partial(_run_stage, model, blocks, chain, bounds)
    return model


def shared_parameters(model: nn.Module, chain) -> list[nn.Parameter]:
    """The parameters of attributes both ends of the chain use (GPT's tied W_e) that this copy holds."""
    params = []
    for name in sorted(set(chain.first) & set(chain.last)):
        part = getattr(model, name, None)
        if isinstance(part, nn.Module):
            params += list(part.parameters())
        elif isinstance(part, nn.Parameter):
            params.append(part)
    return params


class StageView(nn.Module):
    """One stage of the rank's model, as a PipelineStage runs it. It holds no parameters of its own
    (the model is not its child): the rank's model and its optimizer hold them, and the gradients are
    scaled in the loss, not by the stage."""

    def __init__(self, model: nn.Module, stage: int):
        super().__init__()
        self.stage = stage
        self.__dict__["model"] = model  # not registered: a plain reference

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.model(h, stage=self.stage)


class Pipeline:
    """This rank's stages and the schedule that runs a training step through them.

    Args:
        model: the rank's model after `split` (and data parallelism, if any).
        chain: the paper's PipelineChain.
        layout, mesh: the processes (common.mesh); the mesh's "pp" dimension joins the stages.
        schedule: gpipe, 1f1b or interleaved.
        microbatches: M, the pieces of each rank's batch.
        loss: the task's loss of (outputs, targets); each microbatch's is divided by M * grad_accum.
    """

    def __init__(self, model: nn.Module, chain, layout, mesh, rank: int, device: torch.device, schedule: str,
                 microbatches: int, loss, grad_accum: int = 1):
        self.model, self.device = model, device
        self.pp, self.microbatches = layout.pp, microbatches
        self.group = mesh["pp"].get_group()
        self.pp_rank = dist.get_group_rank(self.group, rank)
        self.stride = layout.world_size // layout.pp  # global ranks between neighbouring stages
        self.stages = stages_of(self.pp_rank, self.pp, schedule)
        self.n_stages = self.pp * STAGES_PER_RANK[schedule]
        self.is_first, self.is_last = 0 in self.stages, self.n_stages - 1 in self.stages
        self.kind, self.schedule = schedule, None  # built at the first step, for its microbatches' shapes
        scale = microbatches * grad_accum
        self.loss = lambda outputs, targets: loss(outputs, targets) / scale
        self.shared = shared_parameters(model, chain) if self.is_first or self.is_last else []
        self.tied_group = _tied_group(layout, rank) if set(chain.first) & set(chain.last) else None

    def build_schedule(self, inputs: torch.Tensor) -> None:
        """The stages, told the shapes and dtypes they receive and send (from one microbatch of `inputs`
        run through them once in eval mode, so that no batch-norm statistics move and no dropout draws),
        and the schedule that drives them."""
        shapes = {}
        self.model.eval()
        self.forward(inputs.tensor_split(self.microbatches)[0], shapes)
        self.model.train()
        stages = [PipelineStage(StageView(self.model, s), s, self.n_stages, self.device, input_args=shapes[s][0],
                                output_args=shapes[s][1], group=self.group) for s in self.stages]
        kwargs = dict(loss_fn=self.loss, scale_grads=False)  # each microbatch's loss is scaled already
        if self.kind == "interleaved":
            self.schedule = ScheduleInterleaved1F1B(stages, self.microbatches, **kwargs)
        else:
            schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[self.kind]
            self.schedule = schedule(stages[0], self.microbatches, **kwargs)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Forward and backward of a batch's microbatches; returns the outputs (on the last stage,
        else None) and the sum of the scaled microbatch losses (0 off the last stage). Every rank of
        the pipeline calls it with the batch."""
        if self.schedule is None:
            self.build_schedule(inputs)
        losses = []
        outputs = self.schedule.step(*((inputs,) if self.is_first else ()),
                                     target=targets if self.is_last else None, losses=losses)
        loss = torch.stack(losses).sum().detach() if losses else torch.zeros((), device=self.device)
        return (outputs if self.is_last else None), loss

    def sync_shared_gradients(self) -> None:
        """Sum the gradients of the weight that the first and last stage both hold, so that both copies
        take the same step (Megatron-LM's embedding group)."""
        if self.tied_group is None or not self.shared:
            return
        for p in self.shared:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(grad, group=self.tied_group)

    def counted_parameters(self) -> list[nn.Parameter]:
        """The parameters whose gradients make up the global norm: each weight once (a tied weight's
        copy on the last stage is the first stage's)."""
        skip = {id(p) for p in self.shared} if self.is_last and not self.is_first else set()
        return [p for p in self.model.parameters() if id(p) not in skip]

    # ------------------------------------------------------------ evaluation

    def peer(self, stage: int) -> int:
        """The global rank of the stage's rank in this rank's pipeline."""
        return dist.get_global_rank(self.group, stage % self.pp)

    @torch.no_grad()
    def forward(self, inputs: torch.Tensor, shapes: dict | None = None) -> torch.Tensor | None:
        """A batch through every stage, without microbatches; the outputs on the last stage, else None.
        Every rank of the pipeline calls it with the batch. `shapes` gets each of this rank's stages'
        input and output, as meta tensors."""
        h = inputs
        for stage in range(self.n_stages):
            if stage not in self.stages:
                continue
            if stage > 0 and stage - 1 not in self.stages:
                h = _receive(self.peer(stage - 1), self.device)
            h_in, h = h, self.model(h, stage=stage)
            if shapes is not None:  # what training receives and sends needs (and gives) gradients, but the data
                shapes[stage] = (h_in.to("meta").requires_grad_(stage > 0), h.to("meta").requires_grad_())
            if stage < self.n_stages - 1 and stage + 1 not in self.stages:
                _send(h, self.peer(stage + 1))
        return h if self.is_last else None

    def last_rank(self) -> int:
        """The global rank of the first rank of the last stage (data- and tensor-parallel position 0)."""
        return (self.pp - 1) * self.stride

    def full_state_dict(self, rank: int) -> dict[str, torch.Tensor]:
        """The whole model's weights on CPU on rank 0 (every stage's, each under its own name), {} elsewhere.
        Every rank calls it (data-parallel shards are gathered within each stage first)."""
        weights = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        # one rank per pipeline position sends: the first of its data- and tensor-parallel ranks
        mine = {k: v.cpu() for k, v in weights.items()} if rank % self.stride == 0 else {}
        gathered = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if rank != 0:
            return {}
        merged = {}
        for part in gathered:
            merged.update(part)
        return merged


def _tied_group(layout, rank: int):
    """The process group of this rank's first and last stage (same data- and tensor-parallel position),
    for a weight both use. Every rank creates every such group, in the same order."""
    stride = layout.world_size // layout.pp
    mine = None
    for position in range(stride):
        group = dist.new_group([position, (layout.pp - 1) * stride + position])
        if rank % stride == position:
            mine = group
    return mine


def _send(t: torch.Tensor, dst: int) -> None:
    header = torch.zeros(10, dtype=torch.int64, device=t.device)
    header[0], header[1] = _DTYPES.index(t.dtype), t.dim()
    header[2:2 + t.dim()] = torch.tensor(t.shape)
    dist.send(header, dst)
    dist.send(t.contiguous(), dst)


def _receive(src: int, device: torch.device) -> torch.Tensor:
    header = torch.zeros(10, dtype=torch.int64, device=device)
    dist.recv(header, src)
    dtype, ndim = _DTYPES[int(header[0])], int(header[1])
    t = torch.empty(header[2:2 + ndim].tolist(), dtype=dtype, device=device)
    dist.recv(t, src)
    return t


def check(spec, cfg, data, variable: bool, model) -> None:
    """The pipeline's checks of a config (common.config.validate asks them, with --pp N): a paper whose
    forward is a chain of its blocks (and a model without a `pipeline_refusal` saying why it is not), at least a
    block per stage, inputs of one size (stages exchange activations of one shape), a task whose loss reads the
    outputs alone, no fp16."""
    from common.errors import ConfigError
    from common.tasks import TASKS, Task
    from papers import get_paper, list_papers

    if spec.pipeline is None:
        having = ", ".join(name for name in sorted(list_papers()) if get_paper(name).pipeline)
        raise ConfigError(f"--pp cuts a paper whose forward is a chain of its blocks into stages; {spec.name}'s is not "
                          f"one (papers whose forward is: {having})")
    if getattr(model, "pipeline_refusal", None):  # a model that says why its configuration cannot be cut
        raise ConfigError(f"--pp: {spec.name} {cfg.flavor}: {model.pipeline_refusal}")
    stages = cfg.pp * STAGES_PER_RANK[cfg.pp_schedule]
    blocks = len(model.get_submodule(spec.shard_blocks))
    if blocks < stages:
        raise ConfigError(f"--pp {cfg.pp} --pp-schedule {cfg.pp_schedule} cuts {stages} stages, but {spec.name} "
                          f"{cfg.flavor} has {blocks} blocks ({spec.shard_blocks}); use fewer stages or a deeper "
                          f"flavor")
    if variable:
        raise ConfigError(f"--pp sends activations of one shape between stages, but the {data.inputs}s of {data.name} "
                          f"differ in size; use a fixed-size data set or --image-size N")
    if TASKS[data.task].forward is not Task.forward:
        raise ConfigError(f"--pp runs models that read their inputs alone; {data.task} models also read the targets")
    if cfg.precision == "fp16":
        raise ConfigError("--pp with fp16: the scaler's skipped steps are not agreed between stages; use bf16")
