"""The built-in digits split and each rank's share of it, and the built-in shapes."""

import warnings

import numpy as np
import pytest
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


def test_the_cached_digits_split_is_scikit_learns_and_an_unwritable_cache_is_skipped(tmp_path, monkeypatch):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    expected = train_test_split(digits.images, digits.target, test_size=0.2, stratify=digits.target, random_state=0)
    monkeypatch.setenv("PAPER_STUDY_CACHE", str(tmp_path / "cache"))
    made, read = split_digits(), split_digits()  # the first makes the cache file, the second reads it
    assert len(list((tmp_path / "cache").glob("digits-split-sklearn-*.npz"))) == 1
    for ours in (made, read):
        for a, b in zip(ours, expected):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("PAPER_STUDY_CACHE", str(tmp_path / "file" / "cache"))  # a folder that cannot be made
    for a, b in zip(split_digits(), expected):
        np.testing.assert_array_equal(a, b)


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


@pytest.mark.slow  # trains, exports or compiles: the whole suite's, not the everyday lane's
def test_shapes_are_fixed_balanced_colour_images_that_a_linear_model_cannot_read():
    """The built-in colour data set: the same images every time, ten balanced classes, and hard
    enough that logistic regression on the pixels scores under 0.5 (chance: 0.1)."""
    from sklearn.linear_model import LogisticRegression

    from common.data import shapes

    train, test = get_dataset("shapes").load()
    assert (len(train), len(test)) == (shapes.TRAIN_SIZE, shapes.TEST_SIZE) == (10_000, 2_000)
    x, y = train[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and abs(float(x.mean())) < 3
    assert torch.bincount(train.labels).tolist() == [1000] * 10
    rng = np.random.default_rng(shapes.SEEDS["test"])
    labels = rng.permutation(np.arange(shapes.TEST_SIZE) % 10)
    again = np.rint(shapes.draw(labels[:1000], rng) * 255).astype(np.uint8)
    assert np.array_equal(again, test.images[:1000].numpy()), "drawn again from the seed, the same images"
    assert get_dataset("shapes").load(image_size=48)[0][0][0].shape == (3, 48, 48)

    pixels = lambda d, n: (d.images[:n].reshape(n, -1).float() / 255).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lbfgs may stop before it converges: it fits the training images anyway
        model = LogisticRegression(max_iter=100).fit(pixels(train, 1500), train.labels[:1500].numpy())
    assert model.score(pixels(train, 1500), train.labels[:1500].numpy()) > 0.9, "it fits what it saw"
    assert model.score(pixels(test, 2000), test.labels.numpy()) < 0.5
