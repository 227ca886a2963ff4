"""LoRA: Low-Rank Adaptation of Large Language Models.

Hu, Shen, Wallis, Allen-Zhu, Li, Wang, Wang, Chen, 2021. https://arxiv.org/abs/2106.09685

A pre-trained weight W_0 (d x k) stays frozen and learns its update as a product of two small matrices,
h = W_0 x + (alpha / r) B A x with B (d x r), A (r x k), r << min(d, k) (Section 4.1, eq. 3); after
training W_0 + (alpha / r) B A is one matrix again, so inference costs nothing more. Only the attention
weights are adapted, the MLPs frozen (Section 4.2); W_q and W_v together do best for a fixed number of
trainable parameters (Section 7.1, Table 5), at ranks as small as 1 to 4 (Section 7.2, Table 6).

This file wraps the models of this repository, not a model of its own: `apply_lora` puts a `LoRALinear`
around the attention projections W_q, W_k, W_v (one fused W_qkv in GPT, ViT, Swin and BERT; three
matrices in the Transformer) and W_o, and freezes everything else; `merge_lora` folds the updates back.
"""

import math

import torch
import torch.nn as nn

TARGETS = ("q", "k", "v", "o")  # the paper's W_q, W_k, W_v, W_o (Section 4.2)
INITS = ("gaussian", "kaiming")


class LoRALinear(nn.Module):
    """h = W_0 x + (alpha / r) B A x (Section 4.1, eq. 3), W_0 a frozen nn.Linear.

    Initialisation. The paper: "We use a random Gaussian initialization for A and zero for B, so
    DeltaW = BA is zero at the beginning of training". B is zero here too, so a wrapped model starts as
    the model it wraps. A: init="gaussian" (the default, the paper's) draws N(0, 1/r^2), peft's
    `init_lora_weights="gaussian"`; init="kaiming" draws kaiming_uniform_(a=sqrt(5)), uniform within
    +-1/sqrt(k), as the released code (microsoft/LoRA's loralib) and peft's default
    (`init_lora_weights=True`), nn.Linear's own default init, although the paper says Gaussian.

    Fused projections. `slices` cuts the output rows of W_0 into len(slices) equal parts (a fused W_qkv:
    three, W_q's, W_k's and W_v's rows) and gives each part marked True a rank-r pair (A_i, B_i) of its
    own; the parts marked False get no update. (True,) is one pair over the whole matrix, as peft's LoRA
    on GPT-2's fused c_attn; (True, False, True) adapts W_q and W_v alone inside a fused W_qkv, each with
    its own rank r, as the paper's Table 5 row "W_q, W_v" and loralib's `MergedLinear(...,
    enable_lora=[True, False, True])` for GPT-2. The paper treats each of W_q, W_k, W_v as one d x d
    matrix, not as heads (Section 4.2), so a pair spans all heads of its part. The pairs are held stacked,
    A (n, r, k) and B (n, d / parts, r) for the n parts adapted; W_k's rows are then exactly W_0's.

    Merging. `merge()` adds the update to W_0 ("explicitly compute and store W = W_0 + BA", Section 4.1)
    and `unmerge()` subtracts it again ("recover W_0 by subtracting BA"); while merged the forward is W_0
    alone, so the update is never applied twice. Train unmerged: a merged layer's A and B get no gradient.

    Args:
        base: W_0, the layer adapted; its weight and bias are frozen.
        rank: r, the rank of each update.
        alpha: the update's scale is alpha / r ("we simply set alpha to the first r we try and do not tune
            it"): changing r then needs no new learning rate.
        dropout: on x before A (loralib's and peft's lora_dropout); 0 for none.
        slices: which equal parts of W_0's output rows are adapted (see above); (True,): all of W_0.
        init: A's initialisation, "gaussian" or "kaiming" (see above).
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0,
                 slices: tuple[bool, ...] = (True,), init: str = "gaussian"):
        super().__init__()
        d, k = base.out_features, base.in_features
        if rank < 1:
            raise ValueError(f"the rank r must be at least 1, not {rank}")
        if not any(slices) or d % len(slices):
            raise ValueError(f"slices {slices} must adapt at least one of equal parts of the {d} output rows")
        if init not in INITS:
            raise ValueError(f"unknown LoRA init '{init}'; choose from: {', '.join(INITS)}")
        self.W_0 = base.requires_grad_(False)
        self.r, self.alpha, self.scaling = rank, alpha, alpha / rank
        self.slices, self.parts = tuple(slices), [i for i, on in enumerate(slices) if on]
        n, d_part = len(self.parts), d // len(slices)
        factory = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.A = nn.Parameter(torch.empty(n, rank, k, **factory))  # (n, r, k): one A_i per part adapted
        self.B = nn.Parameter(torch.zeros(n, d_part, rank, **factory))  # (n, d / parts, r): zero, so BA = 0
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.merged = False
        with torch.no_grad():
            for A_i in self.A:  # each (r, k), so that kaiming's fan-in is k
                if init == "gaussian":
                    nn.init.normal_(A_i, mean=0.0, std=1 / rank)
                else:
                    nn.init.kaiming_uniform_(A_i, a=math.sqrt(5))

    def spread(self, u: torch.Tensor) -> torch.Tensor:
        """The adapted parts' updates u (..., n, d / parts) among zeros for the parts left out:
        (..., parts, d / parts)."""
        if len(self.parts) == len(self.slices):
            return u  # every part adapted: nothing to place
        full = u.new_zeros(*u.shape[:-2], len(self.slices), u.shape[-1])  # (..., parts, d / parts)
        full[..., self.parts, :] = u
        return full

    def delta_weight(self) -> torch.Tensor:
        """DeltaW = (alpha / r) B A (d, k), zero on the rows of the parts left out."""
        BA = self.B @ self.A  # (n, d / parts, r) @ (n, r, k) -> (n, d / parts, k)
        full = BA.new_zeros(len(self.slices), *BA.shape[1:])  # (parts, d / parts, k)
        full[self.parts] = BA
        return self.scaling * full.flatten(0, 1)  # (d, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., k) -> h (..., d)."""
        h = self.W_0(x)  # W_0 x, (..., d)
        if self.merged:
            return h  # W_0 holds the update already
        z = torch.einsum("...k,nrk->...nr", self.dropout(x), self.A)  # A_i x, (..., n, r)
        u = torch.einsum("...nr,ndr->...nd", z, self.B)  # B_i A_i x, (..., n, d / parts)
        return h + self.scaling * self.spread(u).flatten(-2)  # W_0 x + (alpha / r) B A x, (..., d)

    @torch.no_grad()
    def merge(self) -> None:
        """W_0 <- W_0 + (alpha / r) B A; the forward is then W_0 alone."""
        if not self.merged:
            self.W_0.weight += self.delta_weight()
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """W_0 <- W_0 - (alpha / r) B A, the pre-trained weight again (up to rounding)."""
        if self.merged:
            self.W_0.weight -= self.delta_weight()
            self.merged = False

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha}, slices={self.slices}, merged={self.merged}"


def attention_projections(model: nn.Module):
    """(module, attribute, parts) of every attention projection of `model`: a module holding a fused W_qkv,
    or W_q, W_k and W_v, is an attention layer; its W_o is the output projection (a W_o elsewhere, as
    Bahdanau's output layer, is not). parts: the targets a layer covers, "qkv" for a fused W_qkv."""
    found = []
    for module in model.modules():
        if isinstance(getattr(module, "W_qkv", None), nn.Module):
            found.append((module, "W_qkv", "qkv"))
        elif all(isinstance(getattr(module, f"W_{t}", None), nn.Module) for t in "qkv"):
            found += [(module, f"W_{t}", t) for t in "qkv"]
        else:
            continue
        if isinstance(getattr(module, "W_o", None), nn.Module):
            found.append((module, "W_o", "o"))
    return found


def apply_lora(model: nn.Module, rank: int, alpha: float, targets=("q", "v"), dropout: float = 0.0,
               fused: bool = False, init: str = "gaussian") -> nn.Module:
    """Wrap the attention weights named in `targets` in LoRALinear, in place, and freeze every other
    parameter of `model` (Section 4.2: "adapting the attention weights ... and freeze the MLP modules").

    Args:
        model: a model of this repository whose attention layers hold W_qkv (GPT, ViT, Swin, BERT) or
            W_q, W_k, W_v (the Transformer), and W_o.
        rank, alpha, dropout, init: each LoRALinear's.
        targets: of "q", "k", "v", "o", the paper's W_q, W_k, W_v, W_o; ("q", "v") is the paper's choice
            (Section 7.1, Table 5). Within a fused W_qkv each target gets a pair (A, B) of its own.
        fused: one pair over a fused W_qkv's whole output instead (peft's LoRA on GPT-2's c_attn, the
            reference `from_peft` matches); targets must then hold all of q, k and v.

    Returns:
        model, whose trainable parameters are the A and B of the layers wrapped.
    """
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        raise ValueError(f"unknown LoRA target(s) {', '.join(map(repr, unknown)) or 'none given'}; "
                         f"choose from: {', '.join(TARGETS)}")
    if fused and not {"q", "k", "v"} <= set(targets):
        raise ValueError(f"fused=True puts one update over all of W_qkv: targets must hold q, k and v, not {targets}")
    found = attention_projections(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no attention layer holding W_qkv or W_q, W_k, W_v")
    if any(isinstance(getattr(m, name), LoRALinear) for m, name, _ in found):
        raise ValueError(f"{type(model).__name__} has LoRA already; merge_lora it first")
    model.requires_grad_(False)
    for module, name, parts in found:
        base = getattr(module, name)
        wanted = tuple(t in targets for t in parts)  # (q?, k?, v?) of a fused W_qkv; (t?,) of one matrix
        if any(wanted):
            slices = (True,) if fused or len(parts) == 1 else wanted
            setattr(module, name, LoRALinear(base, rank, alpha, dropout, slices, init))
    return model


def trainable_parameters(model: nn.Module) -> int:
    """The number of parameters that train (requires_grad)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every LoRALinear's update into its W_0 and put the plain nn.Linear back in its place, in place
    (peft's merge_and_unload): the model is then the original architecture with W = W_0 + (alpha / r) B A
    (Section 4.1, "No Additional Inference Latency")."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                child.merge()
                setattr(parent, name, child.W_0)
    return model
