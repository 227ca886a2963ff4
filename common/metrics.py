"""The metrics that are running sums (accuracy, a mean, mean squared error, a sum), kept in float64 and
summed over the ranks when they are computed.

Each is torchmetrics' metric of the same name computed the same way (tests/test_metrics.py compares
them), with the same surface the trainer uses (`update`, `compute`, `reset`, `to`, `sync_on_compute`,
`process_group`), so a task may hold ours and torchmetrics' side by side. torchmetrics keeps the metrics
that are more than sums: detection's mean average precision and seq2seq's BLEU. These are ours because
torchmetrics' package imports every metric it has (scipy's signal processing, matplotlib, transformers,
torchvision's models) whichever one is asked for: about 4.5 s of CPU in each process that evaluates,
more than torch's own import, paid by every run's ranks (docs/performance.md).
"""

import torch
import torch.distributed as dist


class Sums:
    """A metric made of running sums: `update` adds to them, `compute` sums them over the ranks of
    `process_group` (all of them by default) when `sync_on_compute` and a process group is up, then
    reads the value from the totals. Every rank of the group must call `compute`."""

    size = 2  # the sums kept: (total, count) for a mean

    def __init__(self):
        self.sync_on_compute, self.process_group = True, None
        self.sums = torch.zeros(self.size, dtype=torch.float64)

    def reset(self) -> None:
        self.sums.zero_()

    def to(self, device) -> "Sums":
        self.sums = self.sums.to(device)
        return self

    def add(self, *values) -> None:
        self.sums += torch.stack([torch.as_tensor(v, dtype=torch.float64, device=self.sums.device) for v in values])

    def totals(self) -> torch.Tensor:
        sums = self.sums.clone()
        if self.sync_on_compute and dist.is_available() and dist.is_initialized():
            dist.all_reduce(sums, group=self.process_group)
        return sums

    def compute(self) -> torch.Tensor:
        total, count = self.totals()
        return total / count


class Mean(Sums):
    """torchmetrics' MeanMetric: the mean of every value updated with (a NaN stays a NaN)."""

    def update(self, values) -> None:
        values = torch.as_tensor(values, dtype=torch.float64, device=self.sums.device)
        self.add(values.sum(), values.numel())


class Accuracy(Sums):
    """torchmetrics' MulticlassAccuracy with average="micro": the share of samples whose highest logit
    is their class. Logits (B, classes), targets (B,)."""

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        self.add((logits.argmax(-1) == targets).sum(), targets.numel())


class MeanSquaredError(Sums):
    """torchmetrics' MeanSquaredError: the mean of (prediction - target)^2 over every element."""

    def update(self, predictions: torch.Tensor, targets: torch.Tensor) -> None:
        self.add((predictions.double() - targets.double()).square().sum(), targets.numel())


class Sum(Sums):
    """torchmetrics' SumMetric: the sum of every value updated with."""

    size = 1

    def update(self, values) -> None:
        self.add(torch.as_tensor(values, dtype=torch.float64, device=self.sums.device).sum())

    def compute(self) -> torch.Tensor:
        return self.totals()[0]


class Metrics(dict):
    """A task's metrics by name (ours or torchmetrics'), computed, moved and reset together."""

    def compute(self) -> dict[str, torch.Tensor]:
        """Each metric's value by its name; a metric that computes several (mean average precision's
        dict) gives each under its own name, as torchmetrics' MetricCollection does."""
        values = {}
        for name, metric in self.items():
            value = metric.compute()
            values.update(value if isinstance(value, dict) else {name: value})
        return values

    def to(self, device) -> "Metrics":
        for metric in self.values():
            metric.to(device)
        return self

    def reset(self) -> None:
        for metric in self.values():
            metric.reset()
