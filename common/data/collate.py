"""Batching samples of different lengths: pad to the longest and say where each ends."""

import torch
from torch.nn.utils.rnn import pad_sequence


def pad_sequences(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[dict, torch.Tensor]:
    """(sequence (T_i, F), target) pairs -> ({"x": (B, T_max, F) zero-padded, "lengths": (B,)}, targets (B, ...)).

    The inputs are a dict of the model's keyword arguments: `model(**inputs)`.
    """
    sequences, targets = zip(*samples)
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    x = pad_sequence(list(sequences), batch_first=True)  # (B, T_max, F)
    return {"x": x, "lengths": lengths}, torch.stack(targets)
