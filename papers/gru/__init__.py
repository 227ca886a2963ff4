"""GRU and the RNN Encoder-Decoder: Cho et al., 2014.
The spec, and weight loading from torch.nn.GRU."""

import re

import torch.nn as nn

from papers import PaperSpec
from papers.gru.model import FLAVORS, GRU, EncoderDecoder, GRUClassifier

PAPER = PaperSpec(
    name="gru",
    family="rnn",
    title="Learning Phrase Representations using RNN Encoder-Decoder for Statistical Machine Translation",
    authors="Cho, van Merrienboer, Gulcehre, Bahdanau, Bougares, Schwenk, Bengio",
    year=2014,
    url="https://arxiv.org/abs/1406.1078",
    model=EncoderDecoder,
    flavors=FLAVORS,
    inputs="pairs",
    task="seq2seq",
    defaults=dict(dataset="dates", epochs=6, batch_size=64, lr=3e-3, optimizer="adamw", clip_grad=1.0,
                  warmup_steps=100, label_smoothing=0.0, weight_decay=0.0, bucketing="size"),
    reference="torch.nn.GRU (batch_first=True, packed sequences) for the unit; the encoder-decoder has none",
    data_kwargs=("src_vocab", "tgt_vocab", "pad_id"),
    shard_blocks="encoder.layers",
    padded_batches=True,
    # `--flavor classifier`: the GRU unit on its own, a sequence classifier trained as papers/lstm's tiny is
    variants={"classifier": dict(
        model=GRUClassifier, inputs="sequence", task="classification", data_kwargs=("input_size", "num_classes"),
        shard_blocks="gru.layers",
        defaults=dict(dataset="digits-rows", epochs=30, batch_size=64, lr=1e-2, weight_decay=0.01, warmup_steps=50,
                      clip_grad=1.0, label_smoothing=0.1))},
)


def from_torch(torch_gru: nn.GRU) -> GRU:
    """Our GRU holding the weights of a torch.nn.GRU.

    Args:
        torch_gru: an nn.GRU with batch_first=True and biases. Its dropout between layers is not
            carried over (ours has none): the two agree in eval mode, or when its dropout is 0.
    """
    if not torch_gru.batch_first:
        raise ValueError("this nn.GRU has batch_first=False; ours reads (B, T, features): "
                         "build it with batch_first=True")
    if not torch_gru.bias:
        raise ValueError("this nn.GRU has no biases (bias=False); ours always has them: use bias=True")
    w = torch_gru.weight_ih_l0
    model = GRU(torch_gru.input_size, torch_gru.hidden_size, torch_gru.num_layers, torch_gru.bidirectional)
    model = model.to(device=w.device, dtype=w.dtype)
    # nn.GRU's weight_ih_l1_reverse is our layers.1.weight_ih_l1_reverse: same name, same r, z, n stacking
    layer_of = re.compile(r"_l(\d+)")
    state = {f"layers.{layer_of.search(name)[1]}.{name}": p for name, p in torch_gru.state_dict().items()}
    model.load_state_dict(state)  # strict: every tensor of ours is set, and nothing is left over
    return model
