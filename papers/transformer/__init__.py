"""The Transformer: Vaswani et al., 2017. The spec, and weight loading from torch.nn.Transformer."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from papers import PaperSpec
from papers.transformer.model import FLAVORS, Transformer, noam_lambda, noam_rate

__all__ = ["PAPER", "Transformer", "from_torch", "noam_lambda", "noam_rate"]


def _check_layer(layer: nn.Module, where: str) -> None:
    """Refuse what the paper's layer has not, naming the nn.Transformer argument that fixes it."""
    if layer.norm_first:
        raise ValueError(f"{where} is pre-norm (norm_first=True); the paper's layers are post-norm, "
                         "LayerNorm(x + Sublayer(x)): build nn.Transformer with norm_first=False")
    if not layer.self_attn.batch_first:
        raise ValueError(f"{where} reads (T, B, d) (batch_first=False); ours reads (B, T, d): "
                         "build nn.Transformer with batch_first=True")
    if not (layer.activation is F.relu or isinstance(layer.activation, nn.ReLU)):
        raise ValueError(f"{where} uses the activation {layer.activation}; the paper's FFN uses ReLU (eq. 2): "
                         "build nn.Transformer with activation='relu'")
    norms = [m for m in layer.children() if isinstance(m, nn.LayerNorm)]
    if layer.linear1.bias is None or layer.self_attn.in_proj_bias is None or any(n.bias is None for n in norms):
        raise ValueError(f"{where} has no biases (bias=False); ours always has them: build nn.Transformer with bias=True")


def from_torch(torch_transformer: nn.Transformer, src_vocab: int, tgt_vocab: int, pad_id: int = 0,
               share_embeddings: bool = True) -> Transformer:
    """Our Transformer whose encoder and decoder layers hold the weights of a torch.nn.Transformer.

    nn.Transformer has no embeddings, positional encodings or pre-softmax layer: ours keep their own
    initialisation (`Transformer.reset_parameters`). `Transformer.run_encoder` and `run_decoder` then
    compute what nn.Transformer computes on the same embedded inputs.

    Args:
        torch_transformer: an nn.Transformer with batch_first=True, norm_first=False, activation="relu",
            bias=True, and no final LayerNorm after its encoder or decoder stack: nn.Transformer adds one
            to each (encoder.norm, decoder.norm) that the paper's post-norm model has not, so build it
            with custom_encoder=nn.TransformerEncoder(layer, N, norm=None) and
            custom_decoder=nn.TransformerDecoder(layer, N, norm=None). Its dropout is not carried
            over (ours takes `dropout`; it has none on the attention weights): the two agree in eval mode.
        src_vocab, tgt_vocab, pad_id, share_embeddings: as Transformer takes them.
    """
    encoder, decoder = torch_transformer.encoder, torch_transformer.decoder
    for stack, name in ((encoder, "encoder"), (decoder, "decoder")):
        if stack.norm is not None:
            raise ValueError(
                f"this nn.Transformer has a final LayerNorm after its {name} stack ({name}.norm), which the "
                "paper's post-norm Transformer has not; build it with custom_encoder=nn.TransformerEncoder(layer, N, "
                "norm=None) and custom_decoder=nn.TransformerDecoder(layer, N, norm=None)")
    for i, layer in enumerate(encoder.layers):
        _check_layer(layer, f"encoder layer {i}")
    for i, layer in enumerate(decoder.layers):
        _check_layer(layer, f"decoder layer {i}")
    first = encoder.layers[0]
    eps = {m.eps for m in torch_transformer.modules() if isinstance(m, nn.LayerNorm)}
    if len(eps) != 1:
        raise ValueError(f"this nn.Transformer's LayerNorms differ in eps ({sorted(eps)}); ours share one")
    w = first.linear1.weight
    model = Transformer(src_vocab, tgt_vocab, pad_id, d_model=w.shape[1], num_heads=first.self_attn.num_heads,
                        num_encoder_layers=len(encoder.layers), num_decoder_layers=len(decoder.layers),
                        d_ff=w.shape[0], share_embeddings=share_embeddings).to(device=w.device, dtype=w.dtype)
    (eps,) = eps
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            m.eps = eps  # nn.Transformer's layer_norm_eps (1e-5 by default, as ours)

    theirs = torch_transformer.state_dict()
    state = {}

    def attention(ours: str, their: str) -> None:  # nn.MultiheadAttention stacks W_q, W_k, W_v in in_proj
        for p in ("weight", "bias"):
            for W, part in zip(("W_q", "W_k", "W_v"), theirs[f"{their}.in_proj_{p}"].chunk(3)):
                state[f"{ours}.{W}.{p}"] = part
            state[f"{ours}.W_o.{p}"] = theirs[f"{their}.out_proj.{p}"]

    def copy(ours: str, their: str) -> None:
        for p in ("weight", "bias"):
            state[f"{ours}.{p}"] = theirs[f"{their}.{p}"]

    n = len(encoder.layers)
    for i in range(n):
        attention(f"layers.{i}.self_attn", f"encoder.layers.{i}.self_attn")
        for ours, their in (("ffn.W_1", "linear1"), ("ffn.W_2", "linear2"), ("norm1", "norm1"), ("norm2", "norm2")):
            copy(f"layers.{i}.{ours}", f"encoder.layers.{i}.{their}")
    for j in range(len(decoder.layers)):
        attention(f"layers.{n + j}.self_attn", f"decoder.layers.{j}.self_attn")
        attention(f"layers.{n + j}.cross_attn", f"decoder.layers.{j}.multihead_attn")
        for ours, their in (("ffn.W_1", "linear1"), ("ffn.W_2", "linear2"), ("norm1", "norm1"), ("norm2", "norm2"),
                            ("norm3", "norm3")):
            copy(f"layers.{n + j}.{ours}", f"decoder.layers.{j}.{their}")
    layer_keys = {k for k in model.state_dict() if k.startswith("layers.")}
    if set(state) != layer_keys:
        raise ValueError(f"nn.Transformer's weights do not map one to one onto our layers: "
                         f"{sorted(set(state) ^ layer_keys)[:3]}")
    with torch.no_grad():
        model.load_state_dict(state, strict=False)  # every layer weight set (checked above); embeddings kept
    return model


PAPER = PaperSpec(
    name="transformer",
    family="transformer",
    title="Attention Is All You Need",
    authors="Vaswani, Shazeer, Parmar, Uszkoreit, Jones, Gomez, Kaiser, Polosukhin",
    year=2017,
    url="https://arxiv.org/abs/1706.03762",
    model=Transformer,
    flavors=FLAVORS,
    inputs="pairs",
    task="seq2seq",
    defaults=dict(dataset="dates", epochs=10, batch_size=64, lr=1e-3, schedule="cosine", warmup_steps=300,
                  label_smoothing=0.1, clip_grad=1.0, weight_decay=0.0, bucketing="size",
                  length_penalty=0.6),  # Section 6.1: beam search (--beam 4) with alpha = 0.6
    reference="torch.nn.Transformer (batch_first=True, post-norm, without the final LayerNorms of its stacks); "
              "the parameter counts of Table 3",
    data_kwargs=("src_vocab", "tgt_vocab", "pad_id"),
    shard_blocks="layers",  # the encoder's layers, then the decoder's, in one ModuleList
    # Megatron-LM's split of each layer: every attention's heads (the encoder's layers have no
    # cross-attention) and the feed-forward network's hidden units
    tp_plan={f"{attn}.{W}": "colwise" for attn in ("self_attn", "cross_attn") for W in ("W_q", "W_k", "W_v")}
    | {"self_attn.W_o": "rowwise", "cross_attn.W_o": "rowwise", "ffn.W_1": "colwise", "ffn.W_2": "rowwise"},
    padded_batches=True,
)
