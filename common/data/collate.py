"""Batching samples of different sizes: pad to the largest and say where each one is valid.

Images are padded at the bottom and right, so each sample's valid pixels are a
rectangle anchored at the top-left; sequences are padded at the end. The
padded sizes are rounded up to a multiple of `pad_multiple`, so that batches
come in fewer shapes (fewer recompiles under torch.compile) and patch-based
models get sides that divide into patches.

Inputs come back as a dict: {"images", "mask"} or {"x", "lengths", "mask"};
`mask` is True on valid elements.
"""

import torch
from torch.nn.utils.rnn import pad_sequence


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pad_images(samples: list[tuple[torch.Tensor, torch.Tensor]], pad_multiple: int = 1) -> tuple[dict, torch.Tensor]:
    """(image (C, H_i, W_i), target) pairs -> ({"images": (B, C, H, W), "mask": (B, H, W)}, targets (B,))."""
    images, targets = zip(*samples)
    H = round_up(max(im.shape[1] for im in images), pad_multiple)
    W = round_up(max(im.shape[2] for im in images), pad_multiple)
    batch = images[0].new_zeros(len(images), images[0].shape[0], H, W)  # (B, C, H, W)
    mask = torch.zeros(len(images), H, W, dtype=torch.bool)  # (B, H, W)
    for i, im in enumerate(images):
        _, h, w = im.shape
        batch[i, :, :h, :w] = im
        mask[i, :h, :w] = True
    return {"images": batch, "mask": mask}, torch.stack(targets)


def pad_sequences(samples: list[tuple[torch.Tensor, torch.Tensor]], pad_multiple: int = 1) -> tuple[dict, torch.Tensor]:
    """(sequence (T_i, F), target) pairs -> ({"x": (B, T, F), "lengths": (B,), "mask": (B, T)}, targets (B, ...))."""
    sequences, targets = zip(*samples)
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    T = round_up(int(lengths.max()), pad_multiple)
    x = pad_sequence(list(sequences), batch_first=True)  # (B, T_max, F)
    if x.shape[1] < T:
        x = torch.cat([x, x.new_zeros(x.shape[0], T - x.shape[1], *x.shape[2:])], dim=1)  # (B, T, F)
    mask = torch.arange(T) < lengths[:, None]  # (B, T)
    return {"x": x, "lengths": lengths, "mask": mask}, torch.stack(targets)


def element_counts(inputs) -> tuple[int, int]:
    """(valid, all) input elements of a batch: pixels of images, steps of sequences; the
    difference is padding. Read on the host, before the batch moves to the device."""
    if isinstance(inputs, dict):
        mask = inputs["mask"]
        return int(mask.sum()), mask.numel()
    n = inputs.shape[0] * (inputs.shape[-1] * inputs.shape[-2] if inputs.ndim == 4 else inputs.shape[1])
    return n, n  # (B, C, H, W) images or (B, T, F) sequences, no padding
