"""How samples become a batch, and how a batch reaches the device.

A batch is (inputs, targets). Samples of one size are stacked. Samples of
different sizes are padded to the largest and carry a mask: images at the
bottom and right, so each sample's valid pixels are a rectangle anchored at the
top-left; sequences at the end. The padded sizes are rounded up to a multiple of
`pad_multiple`, so that batches come in fewer shapes (fewer recompiles under
torch.compile) and patch-based models get sides that divide into patches.
Padded inputs come back as a dict: {"images", "mask"}, {"x", "lengths",
"mask"}, for pairs of token sequences {"src", "src_lengths", "mask"} with
the padded targets, or for masked-LM samples {"idx", "segments", "mask"};
`mask` is True on valid elements.

Targets are stacked where each sample's target is a tensor or a number, and kept
as a list with one dict per sample where each is a dict (the form torchvision's
detection models take: a variable number of boxes per image). A segmentation
target is a dict of per-pixel maps (class ids "labels", and whatever else its
data set gives per pixel, such as "instances"), padded with the images into one
(B, H, W) map each: the padded pixels of "labels" get IGNORE_INDEX, those of the
others 0 (`pad_segmentation`).
"""

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import default_collate


IGNORE_INDEX = 255  # a segmentation target's pixels without a class: void borders (PASCAL VOC's 255) and padding


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def collate_targets(targets: list):
    """(B,) or (B, ...) stacked targets, or a list of B dicts."""
    return list(targets) if isinstance(targets[0], dict) else default_collate(list(targets))


def stack(samples: list[tuple], pad_multiple: int = 1) -> tuple:
    """(input, target) pairs of one size -> (inputs (B, ...), targets)."""
    inputs, targets = zip(*samples)
    return default_collate(list(inputs)), collate_targets(targets)


def pad_images(samples: list[tuple[torch.Tensor, object]], pad_multiple: int = 1) -> tuple[dict, object]:
    """(image (C, H_i, W_i), target) pairs -> ({"images": (B, C, H, W), "mask": (B, H, W)}, targets)."""
    images, targets = zip(*samples)
    H = round_up(max(im.shape[1] for im in images), pad_multiple)
    W = round_up(max(im.shape[2] for im in images), pad_multiple)
    batch = images[0].new_zeros(len(images), images[0].shape[0], H, W)  # (B, C, H, W)
    mask = torch.zeros(len(images), H, W, dtype=torch.bool)  # (B, H, W)
    for i, im in enumerate(images):
        _, h, w = im.shape
        batch[i, :, :h, :w] = im
        mask[i, :h, :w] = True
    return {"images": batch, "mask": mask}, collate_targets(targets)


def pad_segmentation(samples: list[tuple[torch.Tensor, dict]], pad_multiple: int = 1) -> tuple[dict, dict]:
    """(image (C, H_i, W_i), {"labels": (H_i, W_i), ...per-pixel maps}) pairs -> ({"images": (B, C, H, W),
    "mask": (B, H, W)}, {"labels": (B, H, W), ...}): each map padded as its image, "labels" with
    IGNORE_INDEX (no loss, no score there), the others with 0."""
    inputs, _ = pad_images([(image, 0) for image, _ in samples], pad_multiple)
    B, (H, W) = len(samples), inputs["mask"].shape[1:]
    targets = {}
    for key, first in samples[0][1].items():
        fill = IGNORE_INDEX if key == "labels" else 0
        targets[key] = first.new_full((B, H, W), fill)  # (B, H, W)
        for i, (_, target) in enumerate(samples):
            h, w = target[key].shape
            targets[key][i, :h, :w] = target[key]
    return inputs, targets


def pad_sequences(samples: list[tuple[torch.Tensor, object]], pad_multiple: int = 1) -> tuple[dict, object]:
    """(sequence (T_i, F), target) pairs -> ({"x": (B, T, F), "lengths": (B,), "mask": (B, T)}, targets)."""
    sequences, targets = zip(*samples)
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    T = round_up(int(lengths.max()), pad_multiple)
    x = pad_sequence(list(sequences), batch_first=True)  # (B, T_max, F)
    if x.shape[1] < T:
        x = torch.cat([x, x.new_zeros(x.shape[0], T - x.shape[1], *x.shape[2:])], dim=1)  # (B, T, F)
    mask = torch.arange(T) < lengths[:, None]  # (B, T)
    return {"x": x, "lengths": lengths, "mask": mask}, collate_targets(targets)


def pad_pairs(samples: list[tuple[torch.Tensor, torch.Tensor]], pad_multiple: int = 1, pad_id: int = 0,
              bos_id: int = 1) -> tuple[dict, torch.Tensor]:
    """(source ids (S_i,), target ids (T_i,)) pairs -> ({"src": (B, S), "src_lengths": (B,), "tgt": (B, T),
    "mask": (B, S)}, targets (B, T)), padded at the end with pad_id (targets to their own longest,
    sources to a multiple of pad_multiple). "tgt" is what the decoder reads under teacher forcing:
    <s> (bos_id) then the targets but their last token, so that position t predicts target t."""
    sources, targets = zip(*samples)
    lengths = torch.tensor([len(s) for s in sources], dtype=torch.long)
    S = round_up(int(lengths.max()), pad_multiple)
    src = torch.full((len(sources), S), pad_id, dtype=torch.long)
    for i, s in enumerate(sources):
        src[i, :len(s)] = s
    tgt = pad_sequence(list(targets), batch_first=True, padding_value=pad_id)  # (B, T)
    tgt_in = torch.cat([tgt.new_full((len(targets), 1), bos_id), tgt[:, :-1]], dim=1)  # (B, T): shifted right
    return {"src": src, "src_lengths": lengths, "tgt": tgt_in, "mask": torch.arange(S) < lengths[:, None]}, tgt


def pad_masked_lm(samples: list[tuple[dict, dict]], pad_multiple: int = 1, pad_id: int = 0) -> tuple[dict, dict]:
    """Masked-LM samples ({"idx": (T_i,), "segments": (T_i,)}, {"labels": (T_i,)[, "next_sentence_label": ()]})
    -> ({"idx": (B, T), "segments": (B, T), "mask": (B, T)}, {"labels": (B, T)[, "next_sentence_label": (B,)]}),
    padded at the end: ids with pad_id ([PAD]), segments with 0, labels with IGNORE_INDEX (no prediction)."""
    from common.data.mlm import IGNORE_INDEX

    inputs, targets = zip(*samples)
    lengths = torch.tensor([len(x["idx"]) for x in inputs])
    T = round_up(int(lengths.max()), pad_multiple)
    padded = lambda key, value, rows: torch.stack([F.pad(r[key], (0, T - len(r[key])), value=value) for r in rows])
    batch = {"idx": padded("idx", pad_id, inputs), "segments": padded("segments", 0, inputs),
             "mask": torch.arange(T) < lengths[:, None]}
    labels = {"labels": padded("labels", IGNORE_INDEX, targets)}
    if "next_sentence_label" in targets[0]:
        labels["next_sentence_label"] = torch.stack([y["next_sentence_label"] for y in targets])
    return batch, labels


def to_device(batch, device: torch.device):
    """A batch, or any part of it (tensors in dicts, lists and tuples), on the device."""
    if torch.is_tensor(batch):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def element_counts(inputs) -> tuple[int, int]:
    """(valid, all) input elements of a batch: pixels of images, steps of sequences; the
    difference is padding. Read on the host, before the batch moves to the device."""
    if isinstance(inputs, dict) and "mask" in inputs:
        mask = inputs["mask"]
        return int(mask.sum()), mask.numel()
    if isinstance(inputs, dict):  # unpadded keyword inputs: count the first
        inputs = next(iter(inputs.values()))
    n = inputs.shape[0] * (inputs.shape[-1] * inputs.shape[-2] if inputs.ndim == 4 else inputs.shape[1])
    return n, n  # (B, C, H, W) images or (B, T, F) sequences, no padding
