"""Optimizers and learning-rate schedules: the repo's (AdamW, warmup then cosine) and the papers' own
(SGD with momentum, RMSProp; step decay, exponential decay), chosen by TrainConfig."""

import math

import torch
import torch.nn as nn

from common.choices import OPTIMIZERS, SCHEDULES
from common.dtensor import is_dtensor


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed weights, and the rest (biases, norms: 1-D tensors; and embeddings
    that the model names in `no_weight_decay()`)."""
    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, name: str = "adamw", momentum: float = 0.9,
                    nesterov: bool = False) -> torch.optim.Optimizer:
    """AdamW (decoupled weight decay; fused: one kernel per parameter group and step, on CPU and CUDA,
    except where a tensor-parallel model holds whole and split parameters),
    SGD with momentum (optionally Nesterov's), or RMSProp (decay 0.9, with momentum); weight decay on
    weight matrices only (see `param_groups`).

    Args:
        name: "adamw", "sgd" or "rmsprop".
        momentum: SGD's and RMSProp's momentum.
        nesterov: SGD with Nesterov momentum.
    """
    groups = param_groups(model, weight_decay)
    # tensor parallel holds some parameters whole and some split (DTensors): one kernel cannot take both
    # kinds, so the optimizer then steps each parameter on its own (the same arithmetic)
    mixed = len({is_dtensor(p) for g in groups for p in g["params"]}) > 1
    foreach = False if mixed else None
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), fused=not mixed, foreach=foreach)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=nesterov, foreach=foreach)
    if name == "rmsprop":
        return torch.optim.RMSprop(groups, lr=lr, alpha=0.9, momentum=momentum, foreach=foreach)
    raise ValueError(f"unknown optimizer '{name}'; choose from: {', '.join(OPTIMIZERS)}")


def parse_milestones(text: str | None) -> list[float]:
    """"0.5,0.75" -> [0.5, 0.75]: increasing fractions of the run, each in (0, 1)."""
    try:
        values = [float(v) for v in (text or "").split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(not 0 < v < 1 for v in values) or values != sorted(values):
        raise ValueError(f"milestones must be increasing fractions of the run in (0, 1), such as 0.5,0.75; "
                         f"got {text!r}")
    return values


def parse_gammas(text: str | None, milestones: int) -> list[float] | None:
    """"0.4,0.5" -> [0.4, 0.5]: one positive factor per milestone; None where one gamma serves all."""
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) != milestones or any(v <= 0 for v in values):
        raise ValueError(f"gammas must be {milestones} positive factors, one per milestone, such as 0.4,0.5; "
                         f"got {text!r}")
    return values


def schedule(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, kind: str = "cosine",
             milestones: str | None = None, gamma: float = 0.1, steps_per_epoch: int = 1,
             gammas: str | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning rate as a factor of the peak, step by step: a linear warmup from 0 over `warmup_steps`,
    then

        cosine       cosine decay to 0 at `total_steps`
        step         times `gamma` at each milestone (fractions of `total_steps`), or times the
                     milestone's own factor where `gammas` names one per milestone
        exponential  times `gamma` after every epoch of `steps_per_epoch` steps
        constant     the peak throughout
        noam         Vaswani et al.'s eq. 3, d^-0.5 min(s^-0.5, s warmup^-1.5) at step s = step + 1, as a
                     factor of its peak d^-0.5 warmup^-0.5 (so --lr is that peak): a linear rise over
                     `warmup_steps`, then decay as 1/sqrt(s), whatever `total_steps`
    """
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule '{kind}'; choose from: {', '.join(SCHEDULES)}")
    boundaries = [round(m * total_steps) for m in parse_milestones(milestones)] if kind == "step" else []
    factors = parse_gammas(gammas, len(boundaries)) or [gamma] * len(boundaries)

    def after_warmup(step: int) -> float:
        if kind == "cosine":
            progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        if kind == "step":
            return math.prod(f for f, b in zip(factors, boundaries) if step >= b)
        if kind == "exponential":
            return gamma ** (step // steps_per_epoch)
        return 1.0

    def factor(step: int) -> float:
        if kind == "noam":
            s, w = step + 1, max(1, warmup_steps)
            return min(s ** -0.5, s * w ** -1.5) * w ** 0.5
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        return after_warmup(step)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup from 0 to the peak lr over `warmup_steps`, then cosine decay to 0 at `total_steps`."""
    return schedule(optimizer, total_steps, warmup_steps, "cosine")


def check(cfg) -> None:
    """The optimizer's checks of a config (common.config.validate asks them): a step schedule's milestones
    and factors, and factors only with it."""
    from common.errors import ConfigError

    try:
        if cfg.schedule == "step":
            parse_gammas(cfg.gammas, len(parse_milestones(cfg.milestones)))
        elif cfg.gammas is not None:
            raise ValueError(f"--gammas goes with the step schedule, not {cfg.schedule}")
    except ValueError as e:
        raise ConfigError(str(e)) from None
