"""How a step runs through a parallelized model: whole on every rank, or through a pipeline's stages.

common.parallelize returns one of these two, and the Trainer (and common.bench_memory) only call
their methods, so that the pipeline's branches are here and nowhere else:

    forward_backward        one micro-step: forward, loss, backward (a pipeline interleaves its microbatches')
    sync_shared_gradients   before the update: a weight two stages hold gets their summed gradient
    clip_grad_norm_         clip to the norm of the whole model's gradients (every stage's, with --pp)
    forward, scores         evaluation: a batch's outputs, and the metrics every rank then reports
    full_state_dict         the whole model's weights on rank 0, for model.safetensors

`Whole` runs the model on each rank (single, dp, ddp, fsdp, hsdp, tp and their mixes); `Pipelined`
runs this rank's stages (common.pipeline) with the schedule that sends activations between them.
"""

import contextlib
import math

import torch
import torch.nn as nn

from common import parallel


def autocast(precision: str, device: torch.device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def forward_loss(task, model, inputs, targets, precision: str, device: torch.device,
                 counts: torch.Tensor | None = None) -> torch.Tensor:
    """The training loss of a batch (with a teacher's outputs where the task has one: the only place it runs);
    with `counts`, also adds the batch's (hits, samples) of the task's training metric to it."""
    with autocast(precision, device):
        outputs = task.forward(model, inputs, targets)
        if task.teacher is not None:  # --teacher: its logits on this training batch, for the distillation loss
            outputs = task.taught(outputs, inputs)
        loss = task.loss(outputs, targets)
    if counts is not None:
        counts += task.train_counts(outputs, targets)
    return loss


class Parallelized:
    """This rank's model made ready for its strategy (common.parallelize), and how a step runs on it.

    Attributes:
        model: the wrapped model the optimizer steps (DDP, FSDP2, or the model itself).
        eval_model: what evaluation calls (without DDP's gradient sync).
        saved: the counter of the bytes a forward keeps for backward (common.activations).
        pipeline: this rank's stages and their schedule (common.pipeline.Pipeline), or None.
        replicated: every rank holds the whole model and, after the step's all-reduce, the same gradients.
    """

    pipeline = None
    replicated = False

    def __init__(self, model: nn.Module, eval_model: nn.Module, saved, task, precision: str, device: torch.device):
        self.model, self.eval_model, self.saved = model, eval_model, saved
        self.task, self.precision, self.device = task, precision, device

    def sync_shared_gradients(self) -> None:
        """Nothing to sync: no weight is held twice."""


class Whole(Parallelized):
    """Every rank runs the whole model (its share of each layer under tensor parallelism).

    Args:
        grad_accum: micro-steps per optimizer step; each micro-step's loss is divided by it.
        replicated: single, dp or ddp without fp16's scaler: a non-finite loss on any rank is made to give
            every rank NaN gradients, which the trainer then sees alike without a collective.
    """

    def __init__(self, model, eval_model, saved, task, precision, device, grad_accum: int = 1,
                 replicated: bool = False):
        super().__init__(model, eval_model, saved, task, precision, device)
        self.grad_accum, self.replicated = grad_accum, replicated

    def forward_backward(self, inputs, targets, counts: torch.Tensor | None = None, saved=None,
                         scale=None) -> torch.Tensor:
        """One micro-step's forward (inside `saved`, the activations' counter, if given) and backward (of
        `scale(loss)`: the fp16 scaler's); returns its loss divided by the micro-steps, and adds the batch's
        (hits, samples) of the training metric to `counts`."""
        with saved if saved is not None else contextlib.nullcontext():
            loss = forward_loss(self.task, self.model, inputs, targets, self.precision, self.device,
                                counts) / self.grad_accum
        if self.replicated:  # a non-finite loss makes every gradient NaN, which the all-reduce gives every rank
            loss = loss * torch.where(torch.isfinite(loss), 1.0, math.nan)
        (scale(loss) if scale is not None else loss).backward()
        return loss.detach()

    def clip_grad_norm_(self, max_norm: float, norm: torch.Tensor | None = None) -> torch.Tensor:
        """Clip to the global norm (`norm`, where the caller has it already)."""
        return parallel.clip_grad_norm_(self.model.parameters(), max_norm, total_norm=norm)

    def forward(self, inputs, targets):
        return self.task.forward(self.eval_model, inputs, targets)

    def scores(self, metrics) -> dict[str, float]:
        return self.task.compute(metrics)

    def full_state_dict(self, trainable_only: bool = False) -> dict[str, torch.Tensor]:
        return parallel.full_state_dict(self.model, trainable_only)


class Pipelined(Parallelized):
    """This rank runs its stages of the model; `pipeline` (common.pipeline.Pipeline) sends the activations
    between the stages' ranks and holds the loss, divided by microbatches and micro-steps."""

    def __init__(self, model, eval_model, saved, task, precision, device, pipeline, rank: int):
        super().__init__(model, eval_model, saved, task, precision, device)
        self.pipeline, self.rank = pipeline, rank

    def forward_backward(self, inputs, targets, counts: torch.Tensor | None = None, saved=None,
                         scale=None) -> torch.Tensor:
        """Forward and backward of a micro-step's microbatches (inside `saved`: their peak); returns the sum of
        their scaled losses (0 before the last stage). `scale` is not used: --pp refuses fp16."""
        with saved if saved is not None else contextlib.nullcontext(), autocast(self.precision, self.device):
            outputs, loss = self.pipeline.step(inputs, targets)
        if counts is not None and outputs is not None:
            counts += self.task.train_counts(outputs, targets)
        return loss

    def sync_shared_gradients(self) -> None:
        self.pipeline.sync_shared_gradients()

    def clip_grad_norm_(self, max_norm: float, norm: torch.Tensor | None = None) -> torch.Tensor:
        """Clip to the norm of every stage's gradients (each weight once)."""
        return parallel.clip_grad_norm_(self.model.parameters(), max_norm, self.pipeline.counted_parameters(),
                                        self.pipeline.group)

    def forward(self, inputs, targets):
        """The batch through every stage; its outputs on the last stage, None before it."""
        return self.pipeline.forward(inputs)

    def scores(self, metrics) -> dict[str, float]:
        """The last stage's ranks score the batches; the first of them gives its metrics to every rank."""
        scores = self.task.compute(metrics) if self.pipeline.is_last else None
        return parallel.broadcast_object(scores, src=self.pipeline.last_rank())

    def full_state_dict(self, trainable_only: bool = False) -> dict[str, torch.Tensor]:
        """Every stage's weights (trainable_only: --lora, which --pp refuses, is not taken here)."""
        return self.pipeline.full_state_dict(self.rank)
