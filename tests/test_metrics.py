"""common.metrics' running sums equal torchmetrics' metrics of the same name (which they stand in for
where a metric is a sum; BLEU's n-gram counts too), batch by batch and after a reset; a run's ranks summing them is
tests/test_strategies.py's (the test metrics of two processes equal one process's)."""

import pytest
import torch
from torchmetrics import MeanMetric, MeanSquaredError, SumMetric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import SacreBLEUScore

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


# hypotheses and one or two references each: a word missing, one added, one wrong, a reordering, punctuation,
# an empty hypothesis, a hypothesis longer than its closer reference; batches of 3, 1 and 2
PAIRS = [("the cat sat on the mat.", ["the cat sat on the mat."]), ("a cat on the mat", ["the cat is on the mat"]),
         ("3 March 2015, Tuesday", ["Tuesday, 3 March 2015", "Tuesday 3/3/15"]), ("", ["nothing to say"]),
         ("the the the the cat", ["the cat", "the cat sat there"]), ("it rained all day long", ["it rained all day"])]


@pytest.mark.parametrize("tokenize", ["13a", "char"])
def test_bleu_equals_torchmetrics_sacrebleu_score_and_sacrebleu(tokenize):
    import sacrebleu

    ours, theirs = metrics.BLEU(tokenize=tokenize), SacreBLEUScore(tokenize=tokenize)
    for batch in (PAIRS[:3], PAIRS[3:4], PAIRS[4:]):
        hypotheses, references = [h for h, _ in batch], [r for _, r in batch]
        ours.update(hypotheses, references)
        theirs.update(hypotheses, references)
    assert float(ours.compute()) == pytest.approx(float(theirs.compute()), abs=1e-6) and 0 < float(ours.compute()) < 1
    ours.reset()  # one reference each, as a run scores: sacrebleu's own corpus score (every n-gram order matches)
    hypotheses, references = [h for h, _ in PAIRS if h], [r[0] for h, r in PAIRS if h]
    ours.update(hypotheses, [[r] for r in references])
    expected = sacrebleu.corpus_bleu(hypotheses, [references], tokenize=tokenize).score
    assert 100 * float(ours.compute()) == pytest.approx(expected, abs=1e-4)
    ours.reset()  # no 4-gram matches: 0, as torchmetrics without smoothing
    ours.update(["a b c"], [["a b c"]]) if tokenize == "13a" else ours.update(["ab"], [["ab"]])
    assert float(ours.compute()) == 0.0


def test_a_tasks_scores_are_those_of_the_counts():
    task = get_task("classification", {"num_classes": 10})
    scores = task.build_metrics(torch.device("cpu"))
    for logits, y in BATCHES:
        task.update(scores, logits, y)
    result = task.compute(scores)
    logits, y = (torch.cat(t) for t in zip(*BATCHES))
    assert result["accuracy"] == (logits.argmax(-1) == y).double().mean().item()
    assert result["loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits.double(), y).item(), rel=1e-6)
