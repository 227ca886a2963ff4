"""Shapes: 32x32 colour images of ten shapes on cluttered backgrounds, generated with a fixed seed.

Each image holds one shape (circle, ring, square, triangle, hexagon, star, cross,
crescent, semicircle or corner) of a random colour, size (a radius of 7 to 14
pixels), rotation and position, on a background of a random colour gradient with
noise, line segments and small blots of other colours. Nothing but the shape's
outline tells the class: colour, place, size and angle are drawn independently
of it, so a linear model of the pixels does poorly, while a CNN, built to find
local patterns anywhere, does well. The images are drawn at twice the size and
averaged down, so edges are anti-aliased. Fixed seeds give the same 10,000
training and 2,000 test images every time (generated in a few seconds, kept for
the process).
"""

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

CLASSES = ("circle", "ring", "square", "triangle", "hexagon", "star", "cross", "crescent", "semicircle", "corner")
SIZE, SUPERSAMPLE = 32, 2
TRAIN_SIZE, TEST_SIZE = 10_000, 2_000
SEEDS = {"train": 0, "test": 1}
RADIUS = (7.0, 14.0)  # pixels
LINES, BLOTS = 4, 3  # clutter per image


def _regular(n: int, radius: float = 1.0, phase: float = 0.0) -> np.ndarray:
    """The vertices (n, 2) of a regular n-gon, counter-clockwise."""
    angles = phase + 2 * np.pi * np.arange(n) / n
    return radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)


def _convex(u: np.ndarray, v: np.ndarray, vertices: np.ndarray) -> np.ndarray:
    """Inside a convex polygon (counter-clockwise vertices): left of every edge."""
    inside = np.ones(u.shape, dtype=bool)
    for (x1, y1), (x2, y2) in zip(vertices, np.roll(vertices, -1, axis=0)):
        inside &= (x2 - x1) * (v - y1) - (y2 - y1) * (u - x1) >= 0
    return inside


def _star(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """A five-pointed star: the inner pentagon and five triangular points."""
    outer, inner = _regular(5, 1.0, np.pi / 2), _regular(5, 0.42, np.pi / 2 + np.pi / 5)
    inside = _convex(u, v, inner)
    for k in range(5):  # point k between inner vertices k-1 and k
        inside |= _convex(u, v, np.stack([inner[k - 1], inner[k], outer[k]]))
    return inside


def inside(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Which points (u, v) of the shape's own frame (unit: its radius) lie inside it."""
    r2 = u ** 2 + v ** 2
    if shape == "circle":
        return r2 <= 1
    if shape == "ring":
        return (r2 <= 1) & (r2 >= 0.55 ** 2)
    if shape == "square":
        return (np.abs(u) <= 0.75) & (np.abs(v) <= 0.75)
    if shape == "triangle":
        return _convex(u, v, _regular(3, 1.0, np.pi / 2))
    if shape == "hexagon":
        return _convex(u, v, _regular(6, 1.0))
    if shape == "star":
        return _star(u, v)
    if shape == "cross":
        return ((np.abs(u) <= 0.3) & (np.abs(v) <= 1)) | ((np.abs(v) <= 0.3) & (np.abs(u) <= 1))
    if shape == "crescent":
        return (r2 <= 1) & ((u - 0.5) ** 2 + v ** 2 >= 0.8 ** 2)
    if shape == "semicircle":
        return (r2 <= 1) & (v >= -0.2)
    if shape == "corner":
        return ((u >= -0.8) & (u <= -0.2) & (np.abs(v) <= 0.8)) | ((v >= -0.8) & (v <= -0.2) & (np.abs(u) <= 0.8))
    raise ValueError(f"unknown shape '{shape}'")


def _coverage(mask: np.ndarray) -> np.ndarray:
    """(n, S*k, S*k) bool at k times the size -> (n, S, S) share of each pixel covered (anti-aliasing)."""
    n = mask.shape[0]
    return mask.reshape(n, SIZE, SUPERSAMPLE, SIZE, SUPERSAMPLE).mean(axis=(2, 4), dtype=np.float32)


def _grid(supersample: int = SUPERSAMPLE) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates, in pixels of the final image, (1, S*k, S*k) each (float32)."""
    c = ((np.arange(SIZE * supersample) + 0.5) / supersample).astype(np.float32)
    y, x = np.meshgrid(c, c, indexing="ij")
    return x[None], y[None]


def _paint(images: np.ndarray, coverage: np.ndarray, colours: np.ndarray) -> None:
    """Blend colours (n, 3) into images (n, 3, S, S) where coverage (n, S, S) says, in place."""
    a = coverage[:, None]
    images *= 1 - a
    images += a * colours[:, :, None, None]


def draw(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Images (n, 3, S, S) in [0, 1] of the given classes."""
    n = len(labels)
    x, y = _grid()  # the shape is drawn at twice the size, for smooth edges
    x1, y1 = _grid(1)  # the clutter at the image's own size
    # background: a colour gradient in a random direction, and noise
    c0, c1 = rng.random((n, 3)), rng.random((n, 3))
    direction = rng.uniform(0, 2 * np.pi, n)
    t = (np.cos(direction)[:, None, None] * (np.arange(SIZE)[None, None, :] - SIZE / 2)
         + np.sin(direction)[:, None, None] * (np.arange(SIZE)[None, :, None] - SIZE / 2)) / SIZE + 0.5
    images = (c0[:, :, None, None] + (c1 - c0)[:, :, None, None] * t[:, None]).astype(np.float32)  # (n, 3, S, S)
    images += rng.normal(0, 0.05, images.shape).astype(np.float32)
    # clutter: line segments and small blots of random colours
    col = lambda a: a.astype(np.float32)[:, None, None]  # (n,) -> (n, 1, 1)
    for _ in range(LINES):
        p, q = rng.uniform(0, SIZE, (n, 2)), rng.uniform(0, SIZE, (n, 2))
        (px, py), (dx, dy) = p.T, (q - p).T
        s = np.clip(((x1 - col(px)) * col(dx) + (y1 - col(py)) * col(dy)) / col(dx ** 2 + dy ** 2 + 1e-6), 0, 1)
        dist2 = (x1 - col(px) - s * col(dx)) ** 2 + (y1 - col(py) - s * col(dy)) ** 2
        width = rng.uniform(0.5, 1.2, n)
        _paint(images, (dist2 <= col(width) ** 2).astype(np.float32), rng.random((n, 3)).astype(np.float32))
    for _ in range(BLOTS):
        centre, radius = rng.uniform(0, SIZE, (n, 2)), rng.uniform(1.0, 2.5, n)
        blot = (x1 - col(centre[:, 0])) ** 2 + (y1 - col(centre[:, 1])) ** 2 <= col(radius) ** 2
        _paint(images, blot.astype(np.float32), rng.random((n, 3)).astype(np.float32))
    # the shape: random radius, rotation, position (inside the image) and colour, away from the background's
    radius = rng.uniform(*RADIUS, n)
    angle = rng.uniform(0, 2 * np.pi, n)
    centre = rng.uniform(0, 1, (n, 2)) * (SIZE - 2 * radius[:, None]) + radius[:, None]
    colour = rng.random((n, 3))
    background = images.mean(axis=(2, 3))
    close = np.linalg.norm(colour - background, axis=1) < 0.5
    colour[close] = np.where(background[close] > 0.5, background[close] - 0.5, background[close] + 0.5).clip(0, 1)
    dx, dy = (x - col(centre[:, 0])) / col(radius), (y - col(centre[:, 1])) / col(radius)
    cos, sin = col(np.cos(angle)), col(np.sin(angle))
    u, v = cos * dx + sin * dy, -sin * dx + cos * dy  # the shape's own frame, rotated by -angle
    mask = np.zeros(u.shape, dtype=bool)
    for k, shape in enumerate(CLASSES):
        mine = labels == k
        if mine.any():
            mask[mine] = inside(shape, u[mine], v[mine])
    _paint(images, _coverage(mask), colour.astype(np.float32))
    return images.clip(0, 1)


@lru_cache(maxsize=2)
def _split(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (N, 3, S, S) uint8, labels (N,)) of one split, drawn in chunks from its fixed seed."""
    rng = np.random.default_rng(SEEDS[split])
    n = TRAIN_SIZE if split == "train" else TEST_SIZE
    labels = rng.permutation(np.arange(n) % len(CLASSES))  # balanced classes
    images = np.concatenate([draw(labels[i:i + 1000], rng) for i in range(0, n, 1000)])
    return torch.from_numpy(np.rint(images * 255).astype(np.uint8)), torch.from_numpy(labels).long()


class Shapes(Dataset):
    """One split as (image (3, N, N) float32, normalised by the training set's per-channel mean and std, label)."""

    def __init__(self, split: str, image_size: int | None = None):
        self.images, self.labels = _split(split)
        self.image_size = image_size
        self.mean, self.std = (torch.tensor(s).view(3, 1, 1) for s in channel_stats())

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = (self.images[i].float() / 255 - self.mean) / self.std  # (3, S, S)
        if self.image_size and self.image_size != SIZE:
            x = F.interpolate(x[None], size=(self.image_size,) * 2, mode="bilinear", align_corners=False)[0]
        return x, self.labels[i]


@lru_cache(maxsize=1)
def channel_stats() -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of the training images in [0, 1]."""
    x = _split("train")[0].double() / 255
    return tuple(x.mean(dim=(0, 2, 3)).tolist()), tuple(x.std(dim=(0, 2, 3)).tolist())


def load(image_size: int | None = None, **_) -> tuple[Shapes, Shapes]:
    return Shapes("train", image_size), Shapes("test", image_size)


def facts(image_size: int | None = None, **_) -> dict:
    return dict(num_classes=len(CLASSES), in_chans=3, img_size=image_size or SIZE)


def preprocessing(image_size: int | None = None, **_) -> dict:
    """How an image file becomes a model input (see common.predict)."""
    mean, std = channel_stats()
    size = image_size or SIZE
    return dict(layout="image", mode="RGB", size=[size, size], size_multiple=1, scale=1 / 255, mean=list(mean),
                std=list(std), labels=list(CLASSES))
