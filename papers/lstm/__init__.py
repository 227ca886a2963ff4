"""LSTM: Hochreiter and Schmidhuber, 1997, with the forget gate of Gers et al., 2000.
The spec, and weight loading from torch.nn.LSTM and, for the plain tanh RNN, torch.nn.RNN."""

import re

import torch
import torch.nn as nn

from papers import PaperSpec
from papers.lstm.model import FLAVORS, LSTM, RNN, LSTMClassifier

PAPER = PaperSpec(
    name="lstm",
    family="rnn",
    title="Long Short-Term Memory",
    authors="Hochreiter, Schmidhuber",
    year=1997,
    url="https://doi.org/10.1162/neco.1997.9.8.1735",
    model=LSTMClassifier,
    flavors=FLAVORS,
    inputs="sequence",
    task="classification",
    defaults=dict(dataset="digits-rows", epochs=30, batch_size=64, lr=1e-2, weight_decay=0.01, warmup_steps=50,
                  clip_grad=1.0, label_smoothing=0.1),
    reference="torch.nn.LSTM (batch_first=True, packed sequences; forget gate, no peepholes)",
    data_kwargs=("input_size", "num_classes"),
    shard_blocks="layers",
    padded_batches=True,
)


def from_torch(torch_lstm: nn.LSTM) -> LSTM:
    """Our LSTM holding the weights of a torch.nn.LSTM.

    Args:
        torch_lstm: an nn.LSTM with batch_first=True, biases and no projection (proj_size=0).
            Its dropout between layers is not carried over (ours has none): the two agree
            in eval mode, or when its dropout is 0.
    """
    if not torch_lstm.batch_first:
        raise ValueError("this nn.LSTM has batch_first=False; ours reads (B, T, features): "
                         "build it with batch_first=True")
    if torch_lstm.proj_size != 0:
        raise ValueError(f"this nn.LSTM projects its hidden state (proj_size={torch_lstm.proj_size}), "
                         "which the paper's LSTM has not; use proj_size=0")
    if not torch_lstm.bias:
        raise ValueError("this nn.LSTM has no biases (bias=False); ours always has them: use bias=True")
    model = LSTM(torch_lstm.input_size, torch_lstm.hidden_size, torch_lstm.num_layers, torch_lstm.bidirectional)
    # nn.LSTM's weight_ih_l1_reverse is our layers.1.weight_ih_l1_reverse: same name, same i, f, g, o stacking
    return load_layered(model, torch_lstm)


def from_torch_rnn(torch_rnn: nn.RNN) -> RNN:
    """Our plain tanh RNN holding the weights of a torch.nn.RNN.

    Args:
        torch_rnn: an nn.RNN with batch_first=True, nonlinearity="tanh" and biases. Its dropout
            between layers is not carried over (ours has none): the two agree in eval mode, or
            when its dropout is 0.
    """
    if not torch_rnn.batch_first:
        raise ValueError("this nn.RNN has batch_first=False; ours reads (B, T, features): "
                         "build it with batch_first=True")
    if torch_rnn.nonlinearity != "tanh":
        raise ValueError(f"this nn.RNN uses nonlinearity={torch_rnn.nonlinearity!r}; ours is the tanh RNN: "
                         "use nonlinearity='tanh'")
    if not torch_rnn.bias:
        raise ValueError("this nn.RNN has no biases (bias=False); ours always has them: use bias=True")
    model = RNN(torch_rnn.input_size, torch_rnn.hidden_size, torch_rnn.num_layers, torch_rnn.bidirectional)
    # nn.RNN's weight_hh_l1_reverse is our layers.1.weight_hh_l1_reverse
    return load_layered(model, torch_rnn)


def load_layered(model: nn.Module, reference: nn.Module) -> nn.Module:
    """`model` (our LSTM or RNN) holding the weights of `reference` (nn.LSTM or nn.RNN), on its device
    and in its dtype: each of the reference's tensors, weight_ih_l1_reverse say, is our
    layers.1.weight_ih_l1_reverse."""
    w = reference.weight_ih_l0
    model = model.to(device=w.device, dtype=w.dtype)
    layer_of = re.compile(r"_l(\d+)")
    state = {f"layers.{layer_of.search(name)[1]}.{name}": p for name, p in reference.state_dict().items()}
    with torch.no_grad():
        model.load_state_dict(state)  # strict: every tensor of ours is set, and nothing is left over
    return model
