"""Datasets by name, and the loaders that give every rank its share.

A dataset is registered here with its task kind, its kind of input ("image" or
"sequence"), and the facts a model is built for (classes, channels, image
size, features per step), so that a paper can be paired with any dataset of
its kind of input. A batch is (inputs, targets): inputs are a tensor, or a dict
of the model's keyword arguments (a padded sequence and its lengths).
"""

import itertools
from dataclasses import dataclass
from typing import Callable

from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from common.data import adding, digits, vision
from common.data.collate import pad_sequences


@dataclass(frozen=True)
class DatasetSpec:
    """A named dataset.

    Args:
        name: the --dataset value.
        task: the task kind it is scored with (see common.tasks).
        inputs: what a sample is: "image" (C, H, W) or "sequence" (T, F).
        facts: (data_dir, image_size) -> what the model is built for: num_classes (the
            outputs of its head: classes, or 1 for a scalar target), and in_chans and
            img_size for images, input_size for sequences. Raises ConfigError when the
            data is not where it should be.
        load: (data_dir, image_size) -> (train, test) datasets of (input, target) pairs.
        collate: how samples become a batch (default: stack).
        description: one line for the README.
        resizable: --image-size applies.
    """

    name: str
    task: str
    inputs: str
    facts: Callable[..., dict]
    load: Callable[..., tuple[Dataset, Dataset]]
    collate: Callable | None = None
    description: str = ""
    resizable: bool = False


def _fixed(**facts) -> Callable[..., dict]:
    return lambda **_: dict(facts)


DATASETS = {
    spec.name: spec
    for spec in (
        DatasetSpec("digits", "classification", "image", _fixed(num_classes=10, in_chans=1, img_size=8), digits.load,
                    description="scikit-learn's 1,797 handwritten 8x8 digits, fixed stratified 80/20 split"),
        DatasetSpec("digits-rows", "classification", "sequence", _fixed(num_classes=10, input_size=8),
                    digits.load_rows, description="the same digits read row by row: 8 steps of 8 pixels"),
        DatasetSpec("adding", "regression", "sequence", _fixed(num_classes=1, input_size=2), adding.load,
                    collate=pad_sequences,
                    description=f"the adding problem, lengths {adding.MIN_LENGTH} to {adding.MAX_LENGTH}, "
                                f"{adding.TRAIN_SIZE:,} train / {adding.TEST_SIZE:,} test sequences"),
        DatasetSpec("cifar10", "classification", "image", vision.cifar10_facts, vision.cifar10_load, resizable=True,
                    description="CIFAR-10 from --data-dir (python version), 32x32 RGB, 10 classes"),
        DatasetSpec("mnist", "classification", "image", vision.mnist_facts, vision.mnist_load, resizable=True,
                    description="MNIST from --data-dir (idx files), 28x28 grey, 10 classes"),
        DatasetSpec("fashion-mnist", "classification", "image", vision.fashion_facts, vision.fashion_load,
                    resizable=True, description="Fashion-MNIST from --data-dir (idx files), 28x28 grey, 10 classes"),
        DatasetSpec("imagefolder", "classification", "image", vision.imagefolder_facts, vision.imagefolder_load,
                    resizable=True, description="a folder of class subfolders from --data-dir, resized to --image-size"),
    )
}


def get_dataset(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset '{name}'; choose from: {', '.join(DATASETS)}")
    return DATASETS[name]


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start an epoch part-way, after `start` samples (all ranks together).

    Rank r reads positions r, r + W, r + 2W, ... of the epoch's permutation (seeded by
    seed + epoch), so the k-th micro-batches of all ranks together are one contiguous
    slice of it: the global batch, and where an epoch stands, do not depend on W.
    """

    def __init__(self, dataset: Dataset, rank: int, world_size: int, seed: int):
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        super().set_epoch(epoch)
        if start % self.num_replicas:
            raise ValueError(f"position {start} does not divide over {self.num_replicas} ranks")
        self.start = start // self.num_replicas

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.start, None)

    def __len__(self) -> int:
        return self.num_samples - self.start


def train_loader(dataset: Dataset, micro_batch: int, rank: int, world_size: int, seed: int, num_workers: int = 0,
                 collate: Callable | None = None) -> DataLoader:
    """This rank's micro-batches of a fresh permutation every epoch (call `loader.sampler.set_epoch`).
    Incomplete batches are dropped."""
    sampler = ResumableSampler(dataset, rank=rank, world_size=world_size, seed=seed)
    return DataLoader(dataset, batch_size=micro_batch, sampler=sampler, drop_last=True, num_workers=num_workers,
                      collate_fn=collate)


def eval_loader(dataset: Dataset, batch_size: int, rank: int, world_size: int,
                collate: Callable | None = None) -> DataLoader:
    """This rank's disjoint share of the evaluation set, with no sample repeated or left out."""
    shard = Subset(dataset, range(rank, len(dataset), world_size))
    return DataLoader(shard, batch_size=batch_size, shuffle=False, collate_fn=collate)
