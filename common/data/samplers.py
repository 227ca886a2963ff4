"""Which samples each rank reads, and in what order.

Both samplers cut every epoch into global batches (the same whatever the number
of processes), give each rank its share of every global batch, can start an
epoch part-way (`set_epoch(epoch, start=samples already seen)`), and give every
rank the same number of batches, so no rank waits for another at an epoch's end.

A data set too large for a permutation in memory (token shards: a 1 GB corpus is
7.8 million blocks, and DistributedSampler's `randperm(N).tolist()` of them
hundreds of MB) opts in to `ChunkedOrder` with a `shuffle_chunk` attribute.
"""

import itertools

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler


class ChunkedOrder:
    """A random order of n samples made as it is read, in memory O(n / chunk + chunk), not O(n).

    Two levels, both seeded by seed + epoch: the samples are dealt into K = ceil(n / chunk)
    chunks (chunk j holds samples j, j + K, j + 2K, ...: every chunk spans the whole data set,
    so the batches cut from one chunk do not all come from one stretch of the text), the
    chunks are read in a random order, and each chunk's samples in a random order of their own
    (drawn when the reading reaches it). Starting part-way (`positions`) finds its chunk in the
    chunks' order and walks none of the positions before it, so a resumed epoch goes on exactly.

    Args:
        n: samples.
        seed: the run's seed plus the epoch.
        chunk: samples per chunk (at most; the chunks' sizes differ by at most one).
    """

    def __init__(self, n: int, seed: int, chunk: int):
        self.n, self.seed = n, seed
        self.K = max(1, -(-n // chunk))
        self.chunks = np.random.default_rng([seed]).permutation(self.K)  # (K,) the chunks in reading order
        self.ends = np.cumsum(self.size(self.chunks))  # (K,) where each chunk's positions end

    def size(self, j):
        """Samples in chunk j (j an int or an array of them)."""
        return (self.n - j + self.K - 1) // self.K

    def members(self, j: int) -> np.ndarray:
        """Chunk j's samples in the order they are read."""
        return j + self.K * np.random.default_rng([self.seed, j]).permutation(self.size(j))

    def positions(self, first: int, stop: int, step: int = 1):
        """The samples at positions first, first + step, ... below stop, one chunk in memory at a time."""
        p = first
        while p < stop:
            slot = int(np.searchsorted(self.ends, p, side="right"))
            end = int(self.ends[slot])
            begin = end - int(self.size(self.chunks[slot]))
            yield from self.members(int(self.chunks[slot]))[p - begin : min(stop, end) - begin : step].tolist()
            p += -(-(min(stop, end) - p) // step) * step  # the first position of ours past this chunk

    def __iter__(self):
        return self.positions(0, self.n)


class ResumableSampler(DistributedSampler):
    """A fresh random order each epoch; rank r reads positions r, r + W, r + 2W, ...

    So the k-th micro-batches of all ranks together are one contiguous slice of
    the epoch's permutation (seeded by seed + epoch). That permutation is torch's
    randperm, or, for a data set with a `shuffle_chunk` attribute (samples per chunk),
    a ChunkedOrder, which is never in memory whole.
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
        chunk = getattr(self.dataset, "shuffle_chunk", None)
        if chunk:
            order = ChunkedOrder(len(self.dataset), self.seed + self.epoch, chunk)
            return order.positions(self.start * self.num_replicas + self.rank, self.total_size, self.num_replicas)
        return itertools.islice(super().__iter__(), self.start, None)

    def __len__(self) -> int:
        return self.num_samples - self.start


class RepeatedAugmentation(Sampler[int]):
    """timm's RepeatAugSampler (DeiT's RASampler: each image `repeats` times in an epoch, consecutive in the
    order, so that the ranks augment its copies apart), seeded by the run's seed plus the epoch, and able to
    start an epoch part-way as ResumableSampler can. Rank r reads positions r, r + W, ... of the repeated order,
    so the k-th micro-batches of all ranks are one contiguous slice of it, as ResumableSampler's."""

    def __init__(self, dataset: Dataset, rank: int, world_size: int, seed: int, repeats: int):
        from timm.data.distributed_sampler import RepeatAugSampler  # (timm imports its models: seconds)

        self.timm = RepeatAugSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, num_repeats=repeats)
        self.seed, self.num_replicas, self.start = seed, world_size, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.timm.set_epoch(self.seed + epoch)  # (timm seeds the order by the epoch alone)
        if start % self.num_replicas:
            raise ValueError(f"position {start} does not divide over {self.num_replicas} ranks")
        self.start = start // self.num_replicas

    def __iter__(self):
        return itertools.islice(iter(self.timm), self.start, None)

    def __len__(self) -> int:
        return len(self.timm) - self.start


class BucketBatchSampler(Sampler[list[int]]):
    """Global batches of samples of similar size, in a random order of batches.

    Each epoch (seeded by seed + epoch): shuffle, sort by size (the shuffle breaks
    ties at random), cut into global batches of `global_batch` (an incomplete last
    one is dropped), shuffle the batches. Rank r takes the r-th contiguous share of
    every global batch and yields it as micro-batches of `micro_batch`.

    Args:
        sizes: each sample's size: a length, or (height, width).
        global_batch: samples per optimizer step, over all ranks and micro-steps.
        micro_batch: samples per rank and micro-step.
    """

    def __init__(self, sizes: list, global_batch: int, micro_batch: int, rank: int, world_size: int, seed: int):
        if global_batch % (micro_batch * world_size):
            raise ValueError(f"global batch {global_batch} is not a whole number of {world_size} x {micro_batch}")
        self.sizes = [s if isinstance(s, tuple) else (s,) for s in sizes]
        self.global_batch, self.micro_batch = global_batch, micro_batch
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.epoch, self.start = 0, 0
        self.num_batches = len(sizes) // global_batch

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        if start % self.global_batch:
            raise ValueError(f"position {start} is not a whole number of global batches of {self.global_batch}")
        self.epoch, self.start = epoch, start // self.global_batch

    def global_batches(self) -> list[list[int]]:
        """This epoch's global batches, each sorted by size; the same on every rank."""
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        shuffled = torch.randperm(len(self.sizes), generator=g).tolist()
        order = sorted(shuffled, key=lambda i: self.sizes[i])  # stable: equal sizes stay shuffled
        B = self.global_batch
        batches = [order[k * B:(k + 1) * B] for k in range(self.num_batches)]
        return [batches[k] for k in torch.randperm(len(batches), generator=g).tolist()]

    def __iter__(self):
        share = self.global_batch // self.world_size
        for batch in self.global_batches()[self.start:]:
            mine = batch[self.rank * share:(self.rank + 1) * share]
            for m in range(0, share, self.micro_batch):
                yield mine[m:m + self.micro_batch]

    def __len__(self) -> int:
        return (self.num_batches - self.start) * (self.global_batch // self.world_size // self.micro_batch)
