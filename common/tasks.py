"""Loss and metrics for each kind of task.

Classification serves images and sequences alike (logits (B, classes)); regression
serves scalar targets (outputs (B, 1)).

A task turns model outputs and targets into the training loss, and into sums
over an evaluation set that can be added across ranks before the metrics are
read off them. Papers and datasets name their task kind; the trainer has no
special cases.
"""

import torch
import torch.nn.functional as F


class Classification:
    """Cross-entropy with optional label smoothing; scored by top-1 accuracy."""

    kind = "classification"
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, label_smoothing: float = 0.0):
        self.label_smoothing = label_smoothing

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), targets, label_smoothing=self.label_smoothing)

    def eval_sums(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(correct, count, summed loss) of one batch, to be added over batches and ranks."""
        logits = logits.float()
        correct = (logits.argmax(dim=-1) == targets).sum()
        loss_sum = F.cross_entropy(logits, targets, reduction="sum")
        return torch.stack([correct.double(), logits.new_tensor(targets.numel(), dtype=torch.float64), loss_sum.double()])

    def metrics(self, sums: torch.Tensor) -> dict[str, float]:
        correct, count, loss_sum = sums.tolist()
        return {self.metric: correct / count, "loss": loss_sum / count}


class Regression:
    """Mean squared error against a scalar target; the model's head has one output. Lower is better."""

    kind = "regression"
    metric = "mse"
    higher_is_better = False

    def __init__(self, label_smoothing: float = 0.0):
        pass  # label smoothing applies to classes only

    @staticmethod
    def _pair(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return outputs.float().reshape(targets.shape), targets.float()  # (B, 1) -> (B,)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(*self._pair(outputs, targets))

    def eval_sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(summed squared error, count, summed loss) of one batch."""
        sse = F.mse_loss(*self._pair(outputs, targets), reduction="sum").double()
        return torch.stack([sse, outputs.new_tensor(targets.numel(), dtype=torch.float64), sse])

    def metrics(self, sums: torch.Tensor) -> dict[str, float]:
        sse, count, _ = sums.tolist()
        return {self.metric: sse / count, "loss": sse / count}


TASKS = {task.kind: task for task in (Classification, Regression)}


def get_task(kind: str, label_smoothing: float = 0.0):
    if kind not in TASKS:
        raise ValueError(f"unknown task kind '{kind}'; choose from: {', '.join(TASKS)}")
    return TASKS[kind](label_smoothing=label_smoothing)
