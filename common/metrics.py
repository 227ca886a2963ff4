"""The metrics that are running sums (accuracy, a mean, mean squared error, a sum), kept in float64 and
summed over the ranks when they are computed.

Each is torchmetrics' metric of the same name computed the same way (tests/test_metrics.py compares
them), with the same surface the trainer uses (`update`, `compute`, `reset`, `to`, `sync_on_compute`,
`process_group`), so a task may hold ours and torchmetrics' side by side. torchmetrics keeps the metrics
that are more than sums: detection's mean average precision. Corpus BLEU is sums too (n-gram matches
and totals, and the lengths), so it is ours (torchmetrics' SacreBLEUScore's rule, sacrebleu's
tokenizers). These are ours because
torchmetrics' package imports every metric it has (scipy's signal processing, matplotlib, transformers,
torchvision's models) whichever one is asked for: about 4.5 s of CPU in each process that evaluates,
more than torch's own import, paid by every run's ranks (docs/performance.md).
"""

from collections import Counter

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


class BLEU(Sums):
    """torchmetrics' SacreBLEUScore (n_gram=4, smooth=False, as a fraction, 0 to 1): corpus BLEU from the
    n-gram matches clipped by the references' counts and the hypotheses' n-gram totals, n = 1 to 4, and the
    hypotheses' and closest references' lengths, each summed over the corpus (and the ranks); 0 where some
    n has no match. `tokenize` is sacrebleu's: "13a" (words, its default) or "char"."""

    N = 4
    size = 2 + 2 * N  # hypotheses' length, references' length, matches for each n, totals for each n

    def __init__(self, tokenize: str = "13a"):
        super().__init__()
        if tokenize == "char":
            from sacrebleu.tokenizers.tokenizer_char import TokenizerChar as Tokenizer
        elif tokenize == "13a":
            from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a as Tokenizer
        else:
            raise ValueError(f"tokenize must be '13a' or 'char', not {tokenize!r}")
        self.tokenize = Tokenizer()

    def ngrams(self, words: list[str]) -> Counter:
        return Counter(tuple(words[i:i + n]) for n in range(1, self.N + 1) for i in range(len(words) - n + 1))

    def update(self, hypotheses: list[str], references: list[list[str]]) -> None:
        sums = [0.0] * self.size
        for hypothesis, refs in zip(hypotheses, references, strict=True):
            words = self.tokenize(hypothesis).split()
            ref_words = [self.tokenize(r).split() for r in refs]
            sums[0] += len(words)  # the reference closest in length, the shorter of two as close
            sums[1] += min((abs(len(r) - len(words)), len(r)) for r in ref_words)[1]
            most = Counter()  # each n-gram's largest count in a reference
            for r in ref_words:
                most |= self.ngrams(r)
            counts = self.ngrams(words)
            for gram, count in counts.items():
                sums[1 + len(gram)] += min(count, most[gram])
                sums[1 + self.N + len(gram)] += count
        self.add(*sums)

    def compute(self) -> torch.Tensor:
        sums = self.totals()
        hyp_len, ref_len, matches, totals = sums[0], sums[1], sums[2:2 + self.N], sums[2 + self.N:]
        if matches.min() == 0:
            return torch.tensor(0.0, dtype=torch.float64)
        brevity = 1.0 if hyp_len > ref_len else torch.exp(1 - ref_len / hyp_len)
        return brevity * torch.exp((matches / totals).log().mean())


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
