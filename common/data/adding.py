"""The adding problem (Hochreiter and Schmidhuber 1997, Experiment 4), as used since Le et al. 2015.

Each step holds two numbers: a value drawn uniformly from [0, 1] and a marker;
exactly two steps are marked (one in each half of the sequence) and the target
is the sum of their values. Sequences vary in length. Predicting the mean, 1.0,
always gives a mean squared error of Var(X1 + X2) = 2/12 = 0.167: a model does
better only by remembering the marked values across the sequence.

The 1997 version draws values from [-1, 1], marks the first value among the
first ten steps, and asks for 0.5 + (X1 + X2) / 4; papers/lstm/README.md says more.
"""

import torch
from torch.utils.data import Dataset

MIN_LENGTH, MAX_LENGTH = 10, 30
TRAIN_SIZE, TEST_SIZE = 10_000, 1_000
TRAIN_SEED, TEST_SEED = 0, 1  # fixed: every run sees the same sequences
BASELINE_MSE = 2 / 12  # always predicting 1.0


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
