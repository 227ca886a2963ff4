"""What a run remembers between steps, and across a resume: the Trainer's `TrainState`.

`state_dict()` is the JSON a checkpoint's trainer.json holds (common.checkpoint adds the step's
world size and the optimizer's plain values); `load_state_dict()` reads one back. A trainer.json
saved before a field existed loads with that field's default; a key this version no longer keeps
(or one checkpoint.save adds) is kept as it was in `extra` and written back unchanged, never an error.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainState:
    paper: str
    """the paper trained: a checkpoint of another paper is refused"""
    flavor: str
    """its flavor: a checkpoint of another flavor is refused"""
    step: int = 0
    """optimizer steps done (skipped ones included)"""
    epoch: int = 0
    """epochs done: the one in progress is this one"""
    samples_in_epoch: int = 0
    """the sampler's position: samples of this epoch already trained on"""
    best: list | None = None
    """[value, epoch] of the best evaluation of the task's metric so far; None before the first"""
    best_step: int | None = None
    """the step of that evaluation (its checkpoint is kept whatever --keep-ckpts says)"""
    history: list[float] = field(default_factory=list)
    """the task's metric after each epoch"""
    metrics: dict[str, float] = field(default_factory=dict)
    """the last evaluation's every metric"""
    padding: list[int] = field(default_factory=lambda: [0, 0])
    """(padded, all) input elements trained on, over every rank"""
    elements: int = 0
    """input elements trained on by this rank (for the speed and MFU)"""
    data_wait_seconds: float = 0.0
    """seconds spent waiting for the data loader"""
    train_seconds: float = 0.0
    """seconds spent in training epochs (not evaluating)"""
    wall_seconds: float = 0.0
    """wall time of the run up to its last checkpoint, over every attempt"""
    wandb_run_id: str | None = None
    """the wandb run a resumed run logs on to"""
    curves: dict[str, list] = field(default_factory=dict)
    """[step, value] rows of the curves result.json keeps (losses, training and evaluated metrics, wall time)"""
    commits: list[str | None] = field(default_factory=list)
    """the git commit the run started at, then each one it resumed at (None: saved before runs recorded it)"""
    skipped_steps: int = 0
    """steps whose update --nonfinite skip left out"""
    nonfinite_in_row: int = 0
    """non-finite steps in a row up to the last one (--nonfinite-patience)"""
    lr: float | None = None
    """the learning rate in use: --lr after --lr-scaling (recomputed from the config on resume)"""
    warmup_steps: int | None = None
    """the warmup in use: --warmup-steps, or Goyal et al.'s 5 epochs when longer (recomputed on resume)"""
    scheduler: dict = field(default_factory=dict)
    """the learning-rate schedule's state_dict, as saved"""
    scaler: dict = field(default_factory=dict)
    """the fp16 gradient scaler's state_dict, as saved"""
    extra: dict[str, Any] = field(default_factory=dict)
    """keys of a loaded trainer.json that no field holds (world_size, optimizer_values, older versions' keys)"""

    def state_dict(self) -> dict:
        """The JSON-ready dict trainer.json holds."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return self.extra | out

    def load_state_dict(self, saved: dict) -> None:
        """Every field from a trainer.json's dict; a field it lacks (an older checkpoint) takes its default."""
        fresh = TrainState(paper=saved.get("paper"), flavor=saved.get("flavor"))
        names = {f.name for f in dataclasses.fields(self)} - {"extra"}
        for name in names:
            setattr(self, name, saved[name] if name in saved else getattr(fresh, name))
        self.extra = {k: v for k, v in saved.items() if k not in names}
