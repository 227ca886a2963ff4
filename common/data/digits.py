"""scikit-learn's bundled handwritten digits: 1,797 images of 8x8 pixels, 10 classes.

The data ships inside scikit-learn, so nothing is downloaded. The train/test
split is fixed (stratified, seed 0, 20% test) and does not depend on the run's
seed, so every run of every paper is scored on the same 360 test images.
"""

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset

SPLIT_SEED = 0
TEST_FRACTION = 0.2


def split_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixed stratified split: x_train, x_test (N, 8, 8) in [0, 16], y_train, y_test."""
    digits = load_digits()
    return train_test_split(
        digits.images, digits.target, test_size=TEST_FRACTION, stratify=digits.target, random_state=SPLIT_SEED
    )


def load(**_) -> tuple[TensorDataset, TensorDataset]:
    """Train and test sets of (image (1, 8, 8), label), normalised by the training set's mean and std."""
    x_train, x_test, y_train, y_test = split_digits()
    mean, std = x_train.mean(), x_train.std()

    def to_dataset(x: np.ndarray, y: np.ndarray) -> TensorDataset:
        images = torch.from_numpy((x - mean) / std).float().unsqueeze(1)  # (N, 1, 8, 8)
        return TensorDataset(images, torch.from_numpy(y).long())

    return to_dataset(x_train, y_train), to_dataset(x_test, y_test)


def load_rows(**_) -> tuple[TensorDataset, TensorDataset]:
    """The same digits read row by row: sequences of 8 steps of 8 pixels, (8, 8) per sample."""
    return tuple(TensorDataset(d.tensors[0].squeeze(1), d.tensors[1]) for d in load())
