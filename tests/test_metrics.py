"""common.metrics' running sums equal torchmetrics' metrics of the same name (which they stand in for
where a metric is a sum), batch by batch and after a reset; a run's ranks summing them is
tests/test_strategies.py's (the test metrics of two processes equal one process's)."""

import pytest
import torch
from torchmetrics import MeanMetric, MeanSquaredError, SumMetric
from torchmetrics.classification import MulticlassAccuracy

from common import metrics
from common.tasks import get_task

torch.manual_seed(0)
BATCHES = [(torch.randn(n, 10), torch.randint(0, 10, (n,))) for n in (7, 64, 1, 33)]


def fed(ours, theirs, batches, update):
    for batch in batches:
        update(ours, *batch)
        update(theirs, *batch)
    return float(ours.compute()), float(theirs.compute())


@pytest.mark.parametrize("name", ["accuracy", "mean", "mse", "sum"])
def test_each_metric_equals_torchmetrics_and_resets(name):
    ours, theirs, update = {
        "accuracy": (metrics.Accuracy(), MulticlassAccuracy(10, average="micro").set_dtype(torch.float64),
                     lambda m, logits, y: m.update(logits, y)),
        "mean": (metrics.Mean(), MeanMetric().set_dtype(torch.float64), lambda m, logits, y: m.update(logits[:, 0])),
        "mse": (metrics.MeanSquaredError(), MeanSquaredError().set_dtype(torch.float64),
                lambda m, logits, y: m.update(logits[:, 0], y.float())),
        "sum": (metrics.Sum(), SumMetric().set_dtype(torch.float64), lambda m, logits, y: m.update(logits[:, 1])),
    }[name]
    rel = 1e-6 if name == "mse" else 1e-12  # torchmetrics squares in the inputs' float32, ours in float64
    a, b = fed(ours, theirs, BATCHES, update)
    assert a == pytest.approx(b, rel=rel) and a != 0
    ours.reset(), theirs.reset()
    a, b = fed(ours, theirs, BATCHES[2:], update)
    assert a == pytest.approx(b, rel=rel)


def test_a_tasks_scores_are_those_of_the_counts():
    task = get_task("classification", {"num_classes": 10})
    scores = task.build_metrics(torch.device("cpu"))
    for logits, y in BATCHES:
        task.update(scores, logits, y)
    result = task.compute(scores)
    logits, y = (torch.cat(t) for t in zip(*BATCHES))
    assert result["accuracy"] == (logits.argmax(-1) == y).double().mean().item()
    assert result["loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits.double(), y).item(), rel=1e-6)
