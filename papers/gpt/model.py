"""Improving Language Understanding by Generative Pre-Training (GPT), and Language Models are
Unsupervised Multitask Learners (GPT-2).

Radford, Narasimhan, Salimans, Sutskever, 2018.
https://cdn.openai.com/research-covers/language-unsupervised/language_understanding_paper.pdf
Radford, Wu, Child, Luan, Amodei, Sutskever, 2019.
https://cdn.openai.com/better-language-models/language_models_are_unsupervised_multitask_learners.pdf

A decoder-only Transformer trained to predict the next token, L(U) = sum_i log P(u_i | u_{i-k}..u_{i-1})
(GPT eq. 1): token embeddings plus learned positions, masked self-attention blocks, and a softmax over
the token embedding matrix transposed (eq. 2). GPT's blocks are post-norm, as the Transformer's; GPT-2
moves layer normalisation to each sub-block's input, adds one after the last block, and scales the
residual projections' initial weights by 1/sqrt(N) (GPT-2 Section 2.3). Both are flavors of one model.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x, approximate="tanh"),  # both papers' released code: the tanh approximation
    "gelu_exact": F.gelu,  # the erf form of Hendrycks and Gimpel
    "relu": F.relu,  # the Transformer's FFN
}


class CausalSelfAttention(nn.Module):
    """Masked multi-headed self-attention (GPT Section 3.1): every position attends to itself and the
    positions before it. The heads' W^Q, W^K, W^V are one matrix W_qkv, as the released code's c_attn.

    Args:
        n_embd: the model width d.
        n_head: the heads h; each has d / h dimensions.
        dropout: on the attention weights and on the output projection.
    """

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd {n_embd} does not divide into {n_head} heads")
        self.n_head, self.head_dim, self.dropout_p = n_head, n_embd // n_head, dropout
        self.W_qkv = nn.Linear(n_embd, 3 * n_embd)  # c_attn
        self.W_o = nn.Linear(n_embd, n_embd)  # c_proj: a residual projection (GPT-2's 1/sqrt(N) init)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                past: tuple[torch.Tensor, torch.Tensor] | None = None):
        """x (B, T, d) at the positions after `past`'s.

        Args:
            attn_mask: (B or 1, 1, T, T_past + T) bool, True where a query may attend to a key; None:
                causal (no past) or everything (one new position after a past).
            past: the keys and values of the earlier positions, each (B, h, T_past, d/h).

        Returns:
            (B, T, d), and this layer's keys and values so far, each (B, h, T_past + T, d/h).
        """
        # (B, h, T, d/h), the heads counted from the width (a rank of a tensor-parallel run holds some of them)
        q, k, v = rearrange(self.W_qkv(x), "b t (three h d) -> three b h t d", three=3, d=self.head_dim)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, h, T_past + T, d/h)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=self.dropout_p if self.training else 0.0,
                                           is_causal=attn_mask is None and past is None)  # (B, h, T, d/h)
        return self.resid_dropout(self.W_o(rearrange(a, "b h t d -> b t (h d)"))), (k, v)  # (B, T, d)


class MLP(nn.Module):
    """The position-wise feed-forward network: d -> 4d, GELU (GPT Section 4.1), 4d -> d."""

    def __init__(self, n_embd: int, dropout: float = 0.0, activation: str = "gelu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation '{activation}'; choose from: {', '.join(ACTIVATIONS)}")
        self.W_1 = nn.Linear(n_embd, 4 * n_embd)  # c_fc
        self.W_2 = nn.Linear(4 * n_embd, n_embd)  # c_proj: a residual projection
        self.act = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.W_2(self.act(self.W_1(x))))  # (B, T, 4d) -> (B, T, d)


class Block(nn.Module):
    """transformer_block of GPT eq. 2. Post-norm (GPT, as the Transformer): h = LN(x + Attn(x)),
    LN(h + MLP(h)). Pre-norm (GPT-2 Section 2.3): h = x + Attn(LN(x)), h + MLP(LN(h))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, pre_norm: bool = True,
                 activation: str = "gelu"):
        super().__init__()
        self.pre_norm = pre_norm
        self.norm1 = nn.LayerNorm(n_embd)  # ln_1
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.norm2 = nn.LayerNorm(n_embd)  # ln_2
        self.mlp = MLP(n_embd, dropout, activation)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                past: tuple[torch.Tensor, torch.Tensor] | None = None):
        """x (B, T, d) -> (B, T, d), and the attention's keys and values so far (see CausalSelfAttention)."""
        if self.pre_norm:
            a, present = self.attn(self.norm1(x), attn_mask, past)
            x = x + a  # x + Attn(LN(x))
            return x + self.mlp(self.norm2(x)), present  # x + MLP(LN(x))
        a, present = self.attn(x, attn_mask, past)
        x = self.norm1(x + a)  # LN(x + Attn(x))
        return self.norm2(x + self.mlp(x)), present  # LN(x + MLP(x))


class GPT(nn.Module):
    """h_0 = U W_e + W_p, h_l = transformer_block(h_{l-1}), P(u) = softmax(h_n W_e^T) (GPT eq. 2).

    Args:
        vocab_size: the tokens (GPT: 40,478 BPE merges' tokens; GPT-2: 50,257 byte-level BPE tokens).
        block_size: the positions W_p learns, the longest context (GPT: 512; GPT-2: 1024).
        n_layer, n_head, n_embd: the blocks, heads and width (GPT: 12, 12, 768).
        dropout: on the embeddings, the attention weights and each sub-block's output (0.1 in both papers).
        pre_norm: GPT-2's layer norm at each sub-block's input; False: GPT's post-norm blocks.
        final_norm: GPT-2's layer norm after the last block.
        tie_embeddings: the output layer is W_e^T (eq. 2; both released models); False: its own matrix.
        scale_residual_init: GPT-2's init of the residual projections (W_o, W_2) at 0.02 / sqrt(N),
            N = 2 n_layer residual layers.
        activation: the MLP's non-linearity, "gelu" (tanh approximation), "gelu_exact" or "relu".
    """

    def __init__(
        self,
        vocab_size: int = 50257,
        block_size: int = 1024,
        n_layer: int = 12,
        n_head: int = 12,
        n_embd: int = 768,
        dropout: float = 0.0,
        pre_norm: bool = True,
        final_norm: bool = True,
        tie_embeddings: bool = True,
        scale_residual_init: bool = True,
        activation: str = "gelu",
    ):
        super().__init__()
        self.vocab_size, self.block_size, self.n_layer = vocab_size, block_size, n_layer
        self.tie_embeddings, self.scale_residual_init = tie_embeddings, scale_residual_init
        self.W_e = nn.Embedding(vocab_size, n_embd)  # the token embedding matrix (wte)
        self.W_p = nn.Embedding(block_size, n_embd)  # the position embedding matrix (wpe), learned
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, pre_norm, activation) for _ in range(n_layer))
        self.norm = nn.LayerNorm(n_embd) if final_norm else nn.Identity()  # GPT-2's ln_f
        self.head = None if tie_embeddings else nn.Linear(n_embd, vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, 0.02) for every weight (GPT Section 4.1: "a simple weight initialization of N(0, 0.02)"),
        biases zero, LayerNorm ones and zeros; with scale_residual_init the residual projections W_o and
        W_2 at 0.02 / sqrt(2 n_layer) (GPT-2 Section 2.3, as its released code and Hugging Face's)."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
            if isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if self.scale_residual_init:
            for block in self.blocks:
                for W in (block.attn.W_o, block.mlp.W_2):
                    nn.init.normal_(W.weight, mean=0.0, std=0.02 / math.sqrt(2 * self.n_layer))

    def no_weight_decay(self) -> set[str]:
        """Nothing beyond biases and gains: GPT's L2 (w = 0.01) is on "all non bias or gain weights",
        the embeddings included."""
        return set()

    def attention_mask(self, attention_mask: torch.Tensor | None, T: int, T_past: int,
                       device: torch.device) -> torch.Tensor | None:
        """The (B or 1, 1, T, T_past + T) bool mask of which keys each new position attends to.

        None where SDPA's own is_causal is exact (no past, no padding) or nothing is masked (one new
        position, no padding). Padded keys are masked out; every query keeps its own key, so that a
        padded query (whose output nobody reads) never has a row of nothing and stays finite.
        """
        if attention_mask is None and (T_past == 0 or T == 1):
            return None
        i = torch.arange(T_past, T_past + T, device=device)  # (T,) the queries' positions
        j = torch.arange(T_past + T, device=device)  # (S,) the keys'
        allowed = j[None, :] <= i[:, None]  # (T, S) causal
        if attention_mask is not None:
            if attention_mask.shape[1] != T_past + T:
                raise ValueError(f"attention_mask covers {attention_mask.shape[1]} positions; it must cover the "
                                 f"past's and the new ones, {T_past} + {T}")
            real = attention_mask.to(torch.bool)[:, None, None, :]  # (B, 1, 1, S), True on real tokens
            allowed = allowed & (real | (j[None, :] == i[:, None]))  # (B, 1, T, S)
        return allowed if allowed.dim() == 4 else allowed[None, None]  # (B or 1, 1, T, S)

    def embed(self, idx: torch.Tensor, T_past: int = 0) -> torch.Tensor:
        """h_0 = U W_e + W_p (eq. 2): token and position embeddings (B, T, d) of idx (B, T), positions
        counted after T_past cached ones."""
        positions = torch.arange(T_past, T_past + idx.shape[1], device=idx.device)  # (T,)
        return self.dropout(self.W_e(idx) + self.W_p(positions))

    def forward_features(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None,
                         past: tuple | None = None):
        """h_n (B, T, d) after the final norm (GPT-2) and every layer's keys and values (see `forward`)."""
        T = idx.shape[1]
        T_past = 0 if past is None else past[0][0].shape[2]
        if not torch.compiler.is_compiling() and T_past + T > self.block_size:
            raise ValueError(f"{T_past} + {T} positions exceed the {self.block_size} that W_p learned")
        h = self.embed(idx, T_past)  # h_0, (B, T, d)
        attn_mask = self.attention_mask(attention_mask, T, T_past, idx.device)
        present = []
        for l, block in enumerate(self.blocks):
            h, kv = block(h, attn_mask, None if past is None else past[l])  # h_l, (B, T, d)
            present.append(kv)
        return self.norm(h), tuple(present)

    def forward_head(self, h: torch.Tensor) -> torch.Tensor:
        """h_n W_e^T (eq. 2): (B, T, d) -> logits (B, T, V)."""
        return F.linear(h, self.W_e.weight if self.head is None else self.head.weight)

    def forward(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None, past: tuple | None = None,
                use_cache: bool = False):
        """Next-token logits (B, T, V) for idx (B, T) int64; position t predicts token t + 1.

        Args:
            attention_mask: (B, T_past + T) bool or 0/1, 1 on real tokens, 0 on padding (left or right),
                covering the cached positions too (as Hugging Face's); padded keys are never attended to.
                Positions stay plain (0..T-1 after the past), so only right padding leaves a sample's
                logits what it gets alone.
            past: a previous call's `present`: per layer (k, v), each (B, h, T_past, d/h); idx then holds
                the positions after them.
            use_cache: also return `present`, the keys and values up to these positions, for the next call.
        """
        h, present = self.forward_features(idx, attention_mask, past)
        logits = self.forward_head(h)  # (B, T, V)
        return (logits, present) if use_cache else logits


class GPTClassifier(GPT):
    """GPT fine-tuned for classification (GPT Section 3.2): the pre-trained model reads the passage x^1..x^m,
    and the final block's activation at the last token, h_l^m (after GPT-2's final norm), feeds one added
    linear layer: P(y | x^1..x^m) = softmax(h_l^m W_y) (eq. 3). Language modelling stays an auxiliary
    objective, L_3(C) = L_2(C) + lambda L_1(C) (eq. 5), L_1 the next-token loss of the same passages.

    Every parameter but W_y keeps GPT's name, so a pre-trained GPT's weights load by name (--init RUN_DIR).
    No start or extract tokens (the paper's <s> and $, new rows of W_e): the passage's own last token is
    read; W_y is initialised as every other weight, N(0, 0.02), its bias zero, as the released code's.

    Args:
        num_classes: the outputs of W_y.
        lm_weight: lambda, the auxiliary language-modelling loss's weight (0.5, Section 4.1); 0 leaves it out.
        vocab_size, block_size, n_layer, n_head, n_embd, pre_norm, final_norm, tie_embeddings,
            scale_residual_init, activation: GPT's.
        dropout: GPT's, and on h_l^m before W_y ("dropout to the classifier with a rate of 0.1").
    """

    def __init__(self, num_classes: int = 2, lm_weight: float = 0.5, vocab_size: int = 50257, block_size: int = 1024,
                 n_layer: int = 12, n_head: int = 12, n_embd: int = 768, dropout: float = 0.0, pre_norm: bool = True,
                 final_norm: bool = True, tie_embeddings: bool = True, scale_residual_init: bool = True,
                 activation: str = "gelu"):
        super().__init__(vocab_size, block_size, n_layer, n_head, n_embd, dropout, pre_norm, final_norm,
                         tie_embeddings, scale_residual_init, activation)
        self.lm_weight = lm_weight
        self.W_y = nn.Linear(n_embd, num_classes)  # the added output layer
        nn.init.normal_(self.W_y.weight, mean=0.0, std=0.02)
        nn.init.zeros_(self.W_y.bias)

    def forward(self, idx: torch.Tensor):
        """Class logits (B, classes) of passages idx (B, T); in training with lm_weight, {"logits": them,
        "aux_losses": [(L_1, lambda)]}, L_1 the mean next-token cross-entropy over the passages (as the
        released code's, per token), which common.tasks.Classification adds to L_2 with its weight."""
        h, _ = self.forward_features(idx)  # h_l, (B, T, d)
        logits = self.W_y(self.dropout(h[:, -1]))  # h_l^m W_y, (B, classes)
        if not (self.training and self.lm_weight):
            return logits
        next_token = self.forward_head(h[:, :-1])  # (B, T - 1, V): position t predicts token t + 1
        L_1 = F.cross_entropy(next_token.float().flatten(0, 1), idx[:, 1:].flatten())
        return {"logits": logits, "aux_losses": [(L_1, self.lm_weight)]}


# GPT (Section 4.1: 12 layers, 768 wide, 12 heads, 512 positions; the released model's 40,478 tokens), GPT-2's
# four sizes (Table 2, as released: 1024 positions, 50,257 tokens), and the repo's character-level tiny one.
GPT2 = dict(vocab_size=50257, block_size=1024)
FLAVORS = {
    "tiny": dict(vocab_size=128, block_size=128, n_layer=4, n_head=4, n_embd=128),
    # GPTClassifier (papers/gpt/__init__.py's variant) of tiny's sizes, with the paper's fine-tuning dropout 0.1
    "tiny-classifier": dict(vocab_size=128, block_size=128, n_layer=4, n_head=4, n_embd=128, dropout=0.1),
    "GPT": dict(vocab_size=40478, block_size=512, n_layer=12, n_head=12, n_embd=768, dropout=0.1, pre_norm=False,
                final_norm=False, scale_residual_init=False),
    "GPT-2-124M": dict(**GPT2, n_layer=12, n_head=12, n_embd=768, dropout=0.1),
    "GPT-2-355M": dict(**GPT2, n_layer=24, n_head=16, n_embd=1024, dropout=0.1),
    "GPT-2-774M": dict(**GPT2, n_layer=36, n_head=20, n_embd=1280, dropout=0.1),
    "GPT-2-1558M": dict(**GPT2, n_layer=48, n_head=25, n_embd=1600, dropout=0.1),
}
