"""The built-in digits split, and each rank's share of it."""

import numpy as np
import torch

from common.data import eval_loader, get_dataset, train_loader
from common.data.digits import split_digits


def test_digits_split_is_fixed_stratified_and_normalised():
    train, test = get_dataset("digits").load()
    assert (len(train), len(test)) == (1437, 360)
    x_train, x_test, y_train, y_test = split_digits()
    np.testing.assert_array_equal(split_digits()[3], y_test)  # the same split every time
    counts = np.bincount(y_test, minlength=10)
    expected = np.bincount(np.concatenate([y_train, y_test])) * 0.2
    assert np.abs(counts - expected).max() <= 1  # stratified
    images = train.tensors[0]
    assert images.shape[1:] == (1, 8, 8)
    assert abs(images.mean().item()) < 1e-5 and abs(images.std().item() - 1) < 1e-3
    torch.manual_seed(123)  # the run's seed has no say in the split
    _, test_again = get_dataset("digits").load()
    assert torch.equal(test.tensors[0], test_again.tensors[0])


def test_ranks_together_read_the_single_process_global_batches():
    train, _ = get_dataset("digits").load()
    single = train_loader(train, 64, 64, rank=0, world_size=1, seed=7)
    ranks = [train_loader(train, 64, 32, rank=r, world_size=2, seed=7) for r in range(2)]
    for epoch in (0, 3):
        for loader in [single, *ranks]:
            loader.epoch_sampler.set_epoch(epoch)
        assert len(single) == len(ranks[0]) == len(ranks[1]) == 1437 // 64
        for (x, y), (x0, y0), (x1, y1) in zip(single, *ranks):
            key = lambda xs, ys: sorted(zip(ys.tolist(), xs.flatten(1).sum(1).tolist()))
            assert key(x, y) == key(torch.cat([x0, x1]), torch.cat([y0, y1]))
    first_epoch = [y for _, y in single]
    single.epoch_sampler.set_epoch(1)
    assert not all(torch.equal(a, b) for a, b in zip(first_epoch, [y for _, y in single])), "reshuffled each epoch"


def test_evaluation_shards_are_disjoint_and_cover_the_test_set():
    _, test = get_dataset("digits").load()
    seen = []
    for rank in range(3):
        for x, _ in eval_loader(test, 50, rank=rank, world_size=3):
            seen.extend(x.flatten(1).tolist())
    assert sorted(seen) == sorted(test.tensors[0].flatten(1).tolist())
