"""Datasets by name, and the loaders that give every rank its share.

A dataset is registered here with what the model must be built for (classes,
channels, image size), its task kind and its kind of input, so that a paper
can be paired with any dataset of the same kind of input.
"""

import itertools
from dataclasses import dataclass, field
from typing import Callable

from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from common.data import digits


@dataclass(frozen=True)
class DatasetSpec:
    """A named dataset.

    Args:
        name: the --dataset value.
        task: the task kind it is scored with (see common.tasks).
        inputs: what a sample is ("image"); a paper accepts datasets of its own kind.
        model_kwargs: what the model is built for (num_classes, in_chans, img_size).
        load: data_dir -> (train, test) datasets of (input, target) pairs.
        description: one line for --list.
    """

    name: str
    task: str
    inputs: str
    model_kwargs: dict = field(default_factory=dict)
    load: Callable[[str | None], tuple[Dataset, Dataset]] = None
    description: str = ""


DATASETS = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            name="digits",
            task="classification",
            inputs="image",
            model_kwargs=dict(num_classes=10, in_chans=1, img_size=8),
            load=digits.load,
            description="scikit-learn's 1,797 handwritten 8x8 digits, fixed stratified 80/20 split",
        ),
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


def train_loader(
    dataset: Dataset, micro_batch: int, rank: int, world_size: int, seed: int, num_workers: int = 0
) -> DataLoader:
    """This rank's micro-batches of a fresh permutation every epoch (call `loader.sampler.set_epoch`).
    Incomplete batches are dropped."""
    sampler = ResumableSampler(dataset, rank=rank, world_size=world_size, seed=seed)
    return DataLoader(dataset, batch_size=micro_batch, sampler=sampler, drop_last=True, num_workers=num_workers)


def eval_loader(dataset: Dataset, batch_size: int, rank: int, world_size: int) -> DataLoader:
    """This rank's disjoint share of the evaluation set, with no sample repeated or left out."""
    shard = Subset(dataset, range(rank, len(dataset), world_size))
    return DataLoader(shard, batch_size=batch_size, shuffle=False)
