"""The adding problem (Hochreiter and Schmidhuber 1997, Experiment 4): as used since Le et al. 2015
(`adding`), and as the 1997 paper poses it (`adding-1997`).

Le et al.'s version: each step holds two numbers, a value drawn uniformly from [0, 1] and a marker;
exactly two steps are marked (one in each half of the sequence) and the target is the sum of their
values. Sequences vary in length. Predicting the mean, 1.0, always gives a mean squared error of
Var(X1 + X2) = 2/12 = 0.167: a model does better only by remembering the marked values across the
sequence.

The paper's own version (Section 5.4, Experiment 4), in its words:

    "Each element of each input sequence is a pair of components. The first component is a real
    value randomly chosen from the interval [-1, 1]; the second is either 1.0, 0.0, or -1.0, and is
    used as a marker: at the end of each sequence, the task is to output the sum of the first
    components of those pairs that are marked by second components equal to 1.0. Sequences have
    random lengths between the minimal sequence length T and T + T/10. In a given sequence exactly
    two pairs are marked as follows: we first randomly select and mark one of the first ten pairs
    (whose first component we call X1). Then we randomly select and mark one of the first T/2 - 1
    still unmarked pairs (whose first component we call X2). The second components of all remaining
    pairs are zero except for the first and final pair, whose second components are -1. (In the rare
    case where the first pair of the sequence gets marked, we set X1 to zero.) An error signal is
    generated only at the sequence end: the target is 0.5 + (X1 + X2)/4.0 (the sum X1 + X2 scaled to
    the interval [0, 1]). A sequence is processed correctly if the absolute error at the sequence end
    is below 0.04."

Its Table 7 uses T = 100, 500 and 1000 and tests on 2560 sequences.
"""

from functools import lru_cache

import torch
from torch.utils.data import Dataset

from common.errors import ConfigError

MIN_LENGTH, MAX_LENGTH = 10, 30
TRAIN_SIZE, TEST_SIZE = 10_000, 1_000
TRAIN_SEED, TEST_SEED = 0, 1  # fixed: every run sees the same sequences
BASELINE_MSE = 2 / 12  # always predicting 1.0

DEFAULT_T = 100  # the 1997 version's minimal length T (--seq-len), the first row of Table 7
TRAIN_SIZE_1997, TEST_SIZE_1997 = 10_000, 2_560  # the paper's test set: 2560 sequences (Table 7)
TOLERANCE_1997 = 0.04  # a sequence is processed correctly if the absolute error at its end is below this
# Always predicting the mean, 0.5: Var(X1 + X2) / 16 with Var(X2) = 1/3 (uniform on [-1, 1]) and
# Var(X1) = 9/10 * 1/3 (X1 is zero when the first pair is marked, in 1 of 10 sequences).
BASELINE_MSE_1997 = (0.9 + 1) / 3 / 16  # 0.0396


class AddingProblem(Dataset):
    """`size` generated sequences (T, 2) of lengths in [min_length, max_length], with scalar targets."""

    def __init__(self, size: int, seed: int, min_length: int = MIN_LENGTH, max_length: int = MAX_LENGTH):
        g = torch.Generator().manual_seed(seed)
        self.samples, self.sizes = [], []
        for _ in range(size):
            T = int(torch.randint(min_length, max_length + 1, (), generator=g))
            values = torch.rand(T, generator=g)
            first = int(torch.randint(0, T // 2, (), generator=g))
            second = int(torch.randint(T // 2, T, (), generator=g))
            markers = torch.zeros(T)
            markers[[first, second]] = 1.0
            x = torch.stack([values, markers], dim=1)  # (T, 2)
            self.samples.append((x, values[first] + values[second]))
            self.sizes.append(T)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.samples[i]


def load(**_) -> tuple[AddingProblem, AddingProblem]:
    return AddingProblem(TRAIN_SIZE, TRAIN_SEED), AddingProblem(TEST_SIZE, TEST_SEED)


class AddingProblem1997(Dataset):
    """`size` sequences of the adding problem as Hochreiter and Schmidhuber 1997 pose it (the quote
    above), generated from `seed`: samples (x (L, 2), target ()) with L from T to T + T//10, `sizes`
    (each L) for bucketing, and `marked` (size, 2), the positions of X1 and X2 in each sequence.

    Args:
        size: number of sequences.
        seed: the generator's seed (fixed per split: every run sees the same sequences).
        T: the minimal length, at least 20 (see `load_1997`).
    """

    def __init__(self, size: int, seed: int, T: int = DEFAULT_T):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(T, T + T // 10 + 1, (size,), generator=g)  # (N,) L in T..T + T/10, both ends
        values = 2 * torch.rand(size, int(lengths.max()), generator=g) - 1  # (N, L_max) uniform on [-1, 1]
        rows = torch.arange(size)
        # X1: one of the first ten pairs
        first = torch.randint(0, 10, (size,), generator=g)  # (N,)
        # X2: "one of the first T/2 - 1 still unmarked pairs": the first T/2 - 1 positions once X1's is taken
        # out, that is the first T/2 positions but X1's (X1's lies among them since T >= 20): draw a rank r
        # among the T/2 - 1 unmarked ones, and skip X1's position. T/2 is T // 2 for an odd T.
        # X2 may fall on the first pair (when X1 is elsewhere): it is marked 1.0 there and counts as drawn.
        rank = torch.randint(0, T // 2 - 1, (size,), generator=g)  # (N,)
        second = rank + (rank >= first).long()  # (N,) in 0 .. T//2 - 1, never X1's position
        # "In the rare case where the first pair of the sequence gets marked, we set X1 to zero": when X1 is
        # the first pair (1 sequence in 10), its value is zero, in the input too, so that the target is
        # always the scaled sum of the marked first components
        values[rows[first == 0], 0] = 0.0
        markers = torch.zeros_like(values)  # (N, L_max)
        markers[:, 0] = -1.0  # the first pair
        markers[rows, lengths - 1] = -1.0  # and each sequence's final pair
        markers[rows, first] = 1.0  # marked: the first pair too, when X1 is there
        markers[rows, second] = 1.0
        self.x = torch.stack([values, markers], dim=2)  # (N, L_max, 2), read up to each sequence's length
        self.targets = 0.5 + (values[rows, first] + values[rows, second]) / 4  # (N,) 0.5 + (X1 + X2)/4
        self.marked = torch.stack([first, second], dim=1)  # (N, 2) the positions of X1 and X2
        self.sizes = lengths.tolist()

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i, :self.sizes[i]].clone(), self.targets[i]  # (L, 2), ()


def minimal_length(seq_len: int | None) -> int:
    """The 1997 version's T: --seq-len, or DEFAULT_T. ConfigError below 20, where the first ten pairs
    (X1's) would not all lie in the first half of the sequence, where X2 is drawn."""
    T = DEFAULT_T if seq_len is None else seq_len
    if T < 20:
        raise ConfigError(f"--seq-len {T}: the 1997 adding problem marks X1 among the first ten pairs and X2 "
                          f"among the first T/2 - 1 others, both in the sequence's first half, so T must be "
                          f"at least 20")
    return T


def facts_1997(seq_len: int | None = None, **_) -> dict:
    """What a model is built for (every other option, data_dir, image_size, ..., is ignored); tolerance:
    the absolute error under which a sequence counts as processed correctly."""
    minimal_length(seq_len)
    return dict(num_classes=1, input_size=2, tolerance=TOLERANCE_1997)


@lru_cache(maxsize=None)
def _generate_1997(T: int) -> tuple[AddingProblem1997, AddingProblem1997]:
    return AddingProblem1997(TRAIN_SIZE_1997, TRAIN_SEED, T), AddingProblem1997(TEST_SIZE_1997, TEST_SEED, T)


def load_1997(seq_len: int | None = None, **_) -> tuple[AddingProblem1997, AddingProblem1997]:
    """(train, test) of minimal length T = seq_len (DEFAULT_T when None), generated once per T in a process."""
    return _generate_1997(minimal_length(seq_len))
