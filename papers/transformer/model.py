"""Attention Is All You Need.

Vaswani, Shazeer, Parmar, Uszkoreit, Jones, Gomez, Kaiser, Polosukhin, NIPS 2017. https://arxiv.org/abs/1706.03762

An encoder-decoder for sequence transduction built from attention and position-wise feed-forward
layers only: no recurrence and no convolution, so every position of a layer is computed at once and
any two positions are one attention step apart. Order comes from sinusoidal positional encodings
added to the embeddings; the decoder's self-attention is masked so that position t sees only
positions up to t.

Every sub-layer is post-norm, LayerNorm(x + Dropout(Sublayer(x))) (Section 3.1, 5.4). Attention runs
through torch.nn.functional.scaled_dot_product_attention: the source's padding is masked out of the
encoder's self-attention and the decoder's cross-attention (masks built from the lengths), the
decoder's self-attention is causal. `decode_step` caches every decoder layer's keys and values, its
self-attention's growing by one position a step, its cross-attention's computed once.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange


def positional_encoding(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)) (Section 3.5).

    Args:
        positions: (T,) the positions pos, counted from 0.

    Returns:
        (T, d_model) float32: sine on the even channels, cosine on the odd ones.
    """
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32, device=positions.device)  # (d/2,) 2i
    angles = positions.float()[:, None] * torch.exp(two_i * (-math.log(10000.0) / d_model))  # (T, d/2)
    return rearrange([angles.sin(), angles.cos()], "two t i -> t (i two)")  # (T, d): sin, cos interleaved


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
    (Section 3.2.2), with Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (eq. 1). The h heads' W_i^Q are
    one (d_model, d_model) matrix W_q, and so for W_k and W_v; d_k = d_v = d_model / h. The projections
    have biases, as nn.MultiheadAttention's and fairseq's (the paper writes them as matrices only).

    Args:
        d_model: the model width.
        num_heads: h.
    """

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} does not divide into {num_heads} heads")
        self.num_heads, self.d_k = num_heads, d_model // num_heads
        self.W_q, self.W_k, self.W_v = (nn.Linear(d_model, d_model) for _ in range(3))
        self.W_o = nn.Linear(d_model, d_model)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys K W^K and values V W^V of x (B, N, d_model), split into heads: each (B, h, N, d_k). The
        heads are counted from the width (a rank of a tensor-parallel run holds some of them)."""
        k = rearrange(self.W_k(x), "b n (h d) -> b h n d", d=self.d_k)  # (B, h, N, d_k)
        v = rearrange(self.W_v(x), "b n (h d) -> b h n d", d=self.d_k)  # (B, h, N, d_v)
        return k, v

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        """The queries of x (B, N_q, d_model) attend over keys and values k, v (B, h, N_k, d_k).

        Args:
            key_mask: (B, 1, 1, N_k) bool, True on the keys to attend to; None: all of them.
            is_causal: query t attends to keys 0..t only (N_q == N_k).
        """
        q = rearrange(self.W_q(x), "b n (h d) -> b h n d", d=self.d_k)  # (B, h, N_q, d_k)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, is_causal=is_causal)  # eq. 1, (B, h, N_q, d_v)
        return self.W_o(rearrange(a, "b h n d -> b n (h d)"))  # Concat(head_1..head_h) W^O, (B, N_q, d_model)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (eq. 2), applied to every position alike."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.W_1 = nn.Linear(d_model, d_ff)
        self.W_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.W_2(F.relu(self.W_1(x)))  # (B, N, d_ff) -> (B, N, d_model)


class EncoderLayer(nn.Module):
    """Self-attention, then the FFN, each as LayerNorm(x + Dropout(Sublayer(x))) (Section 3.1, 5.4)."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)  # P_drop on each sub-layer's output

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """x (B, S, d_model); key_mask (B, 1, 1, S), True on the source's real positions."""
        k, v = self.self_attn.keys_values(x)  # (B, h, S, d_k) each
        x = self.norm1(x + self.dropout(self.self_attn(x, k, v, key_mask)))  # (B, S, d_model)
        return self.norm2(x + self.dropout(self.ffn(x)))


class DecoderLayer(nn.Module):
    """Masked self-attention, attention over the encoder's output, then the FFN, each as
    LayerNorm(x + Dropout(Sublayer(x))) (Section 3.1, 3.2.3).

    Teacher forcing runs all T positions at once with a causal mask. Decoding runs one position at a
    time: `past` holds the self-attention's keys and values of the positions before, `memory_kv` the
    cross-attention's keys and values of the encoder's output (computed at the first step)."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)  # "encoder-decoder attention"
        self.ffn = FeedForward(d_model, d_ff)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, y: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None,
                memory_kv: tuple[torch.Tensor, torch.Tensor] | None = None):
        """One decoder layer.

        Args:
            y: (B, T, d_model) the target positions to compute (T = 1 when decoding step by step).
            memory: (B, S, d_model) the encoder's output.
            memory_mask: (B, 1, 1, S), True on the source's real positions.
            past: the self-attention's keys and values of the earlier positions, each (B, h, t, d_k);
                None: y holds every position from the first, and a causal mask applies.
            memory_kv: the cross-attention's keys and values of memory, each (B, h, S, d_k); None:
                computed here.

        Returns:
            y (B, T, d_model); the self-attention's keys and values up to this step, each
            (B, h, t + T, d_k); and the cross-attention's (B, h, S, d_k).
        """
        k, v = self.self_attn.keys_values(y)  # (B, h, T, d_k)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, h, t + T, d_k)
        y = self.norm1(y + self.dropout(self.self_attn(y, k, v, is_causal=past is None)))  # (B, T, d_model)
        m_k, m_v = self.cross_attn.keys_values(memory) if memory_kv is None else memory_kv  # (B, h, S, d_k)
        y = self.norm2(y + self.dropout(self.cross_attn(y, m_k, m_v, memory_mask)))
        return self.norm3(y + self.dropout(self.ffn(y))), (k, v), (m_k, m_v)


class Transformer(nn.Module):
    """The Transformer (Figure 1): embeddings and positional encodings, N encoder layers, N decoder
    layers, and the pre-softmax linear transformation that shares the target embedding's weights.

    Args:
        src_vocab, tgt_vocab: the vocabulary sizes (37,000 shared BPE tokens for WMT'14 En-De, Section 5.1).
        pad_id: the padding id (sources are masked by their lengths; kept for the repo's interface).
        d_model: the model width (512 base, 1024 big).
        num_heads: h (8 base, 16 big).
        num_encoder_layers, num_decoder_layers: N (6 and 6).
        d_ff: the FFN's inner width (2048 base, 4096 big).
        dropout: P_drop, on every sub-layer's output and on the sums of embeddings and positional
            encodings (Section 5.4; 0.1 base, 0.3 big).
        share_embeddings: one weight matrix for the source embedding, the target embedding and the
            pre-softmax transformation (Section 3.4), when src_vocab == tgt_vocab (a joint vocabulary);
            when they differ, or when False, the source has its own embedding and only the target
            embedding and the pre-softmax weights are shared.
    """

    def __init__(
        self,
        src_vocab: int = 37000,
        tgt_vocab: int = 37000,
        pad_id: int = 0,
        d_model: int = 512,
        num_heads: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        d_ff: int = 2048,
        dropout: float = 0.1,
        share_embeddings: bool = True,
    ):
        super().__init__()
        if d_model % 2:
            raise ValueError(f"d_model must be even (sine and cosine pairs of the positional encoding), got {d_model}")
        self.d_model, self.pad_id, self.num_encoder_layers = d_model, pad_id, num_encoder_layers
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)  # also the pre-softmax weights (Section 3.4)
        self.shares_source = share_embeddings and src_vocab == tgt_vocab
        self.src_embed = self.tgt_embed if self.shares_source else nn.Embedding(src_vocab, d_model)
        self.dropout = nn.Dropout(dropout)  # on the embeddings plus positional encodings
        # the encoder's N layers, then the decoder's N: one ModuleList, so that fsdp shards each layer
        self.layers = nn.ModuleList(
            [EncoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_encoder_layers)]
            + [DecoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_decoder_layers)])
        self.reset_parameters()

    @property
    def encoder_layers(self) -> list[EncoderLayer]:
        return list(self.layers)[: self.num_encoder_layers]

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        return list(self.layers)[self.num_encoder_layers:]

    def reset_parameters(self) -> None:
        """The paper does not state its initialisation. As tensor2tensor and fairseq: embeddings from
        N(0, d_model^-0.5), so that the embeddings times sqrt(d_model) have unit variance, the scale of
        the positional encodings; every weight matrix of the layers Xavier uniform (as tensor2tensor and
        nn.Transformer), each of W_q, W_k, W_v, W_o on its own; biases zero; LayerNorm ones and zeros."""
        for embed in (self.tgt_embed,) if self.shares_source else (self.tgt_embed, self.src_embed):
            nn.init.normal_(embed.weight, mean=0.0, std=self.d_model ** -0.5)
        for m in self.layers.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def no_weight_decay(self) -> set[str]:
        """Nothing beyond biases and norms (the paper trains with Adam and no weight decay at all)."""
        return set()

    def embed(self, embedding: nn.Embedding, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Dropout(E[tokens] * sqrt(d_model) + PE) (Sections 3.4, 3.5, 5.4): tokens (B, T) at positions
        start..start+T-1 -> (B, T, d_model)."""
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)  # (T,)
        x = embedding(tokens) * math.sqrt(self.d_model)  # (B, T, d_model)
        return self.dropout(x + positional_encoding(positions, self.d_model).to(x.dtype))

    def run_encoder(self, x: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """The N encoder layers on embedded sources x (B, S, d_model); src_mask (B, S), True on real positions."""
        for layer in self.encoder_layers:
            x = layer(x, src_mask[:, None, None, :])  # (B, S, d_model)
        return x

    def run_decoder(self, y: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """The N decoder layers, teacher-forced, on embedded targets y (B, T, d_model) -> (B, T, d_model)."""
        for layer in self.decoder_layers:
            y, _, _ = layer(y, memory, src_mask[:, None, None, :])
        return y

    def generator(self, y: torch.Tensor) -> torch.Tensor:
        """The pre-softmax linear transformation, sharing the target embedding's weights: (B, T, d_model) -> (B, T, V)."""
        return F.linear(y, self.tgt_embed.weight)

    def encode(self, src: torch.Tensor, src_lengths: torch.Tensor) -> dict[str, torch.Tensor]:
        """src (B, S) ids padded at the end; src_lengths (B,) -> {"memory": (B, S, d_model), "mask": (B, S)},
        the mask True on the source's real positions (its padded rows of memory are never attended to)."""
        mask = torch.arange(src.shape[1], device=src.device)[None, :] < src_lengths.to(src.device)[:, None]  # (B, S)
        return {"memory": self.run_encoder(self.embed(self.src_embed, src), mask), "mask": mask}

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: src (B, S), src_lengths (B,), tgt (B, T) (<s> then the targets but the last)
        -> logits (B, T, tgt_vocab); position t predicts target token t."""
        memory = self.encode(src, src_lengths)
        y = self.run_decoder(self.embed(self.tgt_embed, tgt), memory["memory"], memory["mask"])  # (B, T, d_model)
        return self.generator(y)

    def decode_step(self, memory: dict[str, torch.Tensor], tokens: torch.Tensor, state: dict | None):
        """One decoder step from the previous output tokens (B,) (<s> first, when state is None).

        The state holds, for every decoder layer, the self-attention's keys and values of the steps so far
        ("k", "v": (B, layers, h, t, d_k)) and the cross-attention's of the memory ("memory_k",
        "memory_v": (B, layers, h, S, d_k)). Returns logits (B, tgt_vocab) and the new state."""
        t = 0 if state is None else state["k"].shape[3]
        y = self.embed(self.tgt_embed, tokens[:, None], start=t)  # (B, 1, d_model) at position t
        key_mask = memory["mask"][:, None, None, :]  # (B, 1, 1, S)
        ks, vs, memory_ks, memory_vs = [], [], [], []
        for i, layer in enumerate(self.decoder_layers):
            past = None if state is None else (state["k"][:, i], state["v"][:, i])
            memory_kv = None if state is None else (state["memory_k"][:, i], state["memory_v"][:, i])
            y, (k, v), (m_k, m_v) = layer(y, memory["memory"], key_mask, past, memory_kv)  # (B, 1, d_model)
            ks.append(k)
            vs.append(v)
            memory_ks.append(m_k)
            memory_vs.append(m_v)
        state = {"k": torch.stack(ks, 1), "v": torch.stack(vs, 1),  # (B, layers, h, t + 1, d_k)
                 "memory_k": torch.stack(memory_ks, 1), "memory_v": torch.stack(memory_vs, 1)}  # (B, layers, h, S, d_k)
        return self.generator(y[:, 0]), state  # (B, tgt_vocab)


def noam_rate(step_num: int, d_model: int, warmup_steps: int) -> float:
    """lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5) (eq. 3, Section 5.3): a linear
    rise for warmup_steps steps, then a decay with the inverse square root of the step number. step_num
    counts from 1; its peak, d_model^-0.5 * warmup_steps^-0.5, is at step_num = warmup_steps."""
    step_num = max(step_num, 1)
    return d_model ** -0.5 * min(step_num ** -0.5, step_num * warmup_steps ** -1.5)


def noam_lambda(d_model: int, warmup: int):
    """Eq. 3 as a torch.optim.lr_scheduler.LambdaLR factor: `step` is LambdaLR's count of optimizer steps
    taken (0 for the first), the paper's step_num is step + 1. With the optimizer's lr at 1.0 the learning
    rate is the paper's (base: 4000 warmup steps, a peak of 6.99e-4); divide by noam_rate(warmup, d_model,
    warmup) for a factor whose peak is 1, so that the optimizer's lr is the peak."""
    return lambda step: noam_rate(step + 1, d_model, warmup)


# The paper's Table 3 (base and big, at the shared En-De vocabulary of about 37,000 BPE tokens, Section 5.1),
# and the repo's tiny flavor for the dates data set (which gives its own vocabulary).
#   Transformer-base: 63,082,496 parameters (44,138,496 in the layers), Table 3 says 65M (-2.95%, see README.md)
#   Transformer-big: 214,245,376 (176,357,376 in the layers), Table 3 says 213M (+0.58%)
#   tiny on dates (68 characters): 671,232 (662,528 in the layers)
FLAVORS = {
    "tiny": dict(d_model=128, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=256, dropout=0.1),
    # tiny with P_drop = 0, Table 3 row (D)'s ablation: deterministic training, which the strategy tests
    # compare across processes (dropout draws each rank's own masks)
    "tiny-no-dropout": dict(d_model=128, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=256,
                            dropout=0.0),
    "Transformer-base": dict(src_vocab=37000, tgt_vocab=37000, d_model=512, num_heads=8, num_encoder_layers=6,
                             num_decoder_layers=6, d_ff=2048, dropout=0.1),
    "Transformer-big": dict(src_vocab=37000, tgt_vocab=37000, d_model=1024, num_heads=16, num_encoder_layers=6,
                            num_decoder_layers=6, d_ff=4096, dropout=0.3),
}
