"""Swin Transformer: Hierarchical Vision Transformer using Shifted Windows.

Liu, Lin, Cao, Hu, Wei, Zhang, Lin, Guo, 2021. https://arxiv.org/abs/2103.14030

Self-attention is computed within non-overlapping windows of M x M patches, so its cost grows linearly
with the image's area rather than quadratically (Eq. 1-2), and consecutive blocks alternate between the
regular window partition and one displaced by (M/2, M/2), whose windows cross the previous ones'
borders (Section 3.2, Figure 2). A cyclic shift of the feature map toward the top-left keeps the number
of windows that of the regular partition; a mask keeps the tokens that the shift brought together from
non-adjacent parts of the map from attending to each other (Figure 4). Patch merging halves the
resolution and doubles the width between stages: a hierarchy of feature maps, as a CNN's (Figure 3).

Layout: the feature map is (B, H, W, C) between blocks, as in the released code. A map whose sides are
not multiples of M is zero-padded at the bottom and right to whole windows inside each block, before
the cyclic shift, and cropped after it (the released detection code's padding, torchvision's too); a
side that fits in one window is not shifted (as the released classification code, and torchvision).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange, reduce

from common.layers import ClassifierMixin
from papers.vit.model import MLP  # the 2-layer MLP with GELU of Section 3.1 is ViT's

MASKED = -100.0  # the released code's additive mask between regions: exp(-100) leaves no attention


def window_partition(x: torch.Tensor, M: int) -> torch.Tensor:
    """(B, H, W, C) -> (B * H/M * W/M, M*M, C): the windows, image by image, row by row."""
    return rearrange(x, "b (nh m1) (nw m2) c -> (b nh nw) (m1 m2) c", m1=M, m2=M)


def window_reverse(windows: torch.Tensor, M: int, H: int, W: int) -> torch.Tensor:
    """(B * H/M * W/M, M*M, C) -> (B, H, W, C), window_partition's inverse."""
    return rearrange(windows, "(b nh nw) (m1 m2) c -> b (nh m1) (nw m2) c", nh=H // M, nw=W // M, m1=M)


def shift_regions(size: int, M: int, shift: int) -> torch.Tensor:
    """(size,) which of Figure 4's strips each row (or column) of the cyclically shifted map holds: 0 for
    the rows that stay together, 1 for the last window's rows from the map's end, 2 for the `shift`
    rows that the cyclic shift brought from the map's start. Without a shift, one strip."""
    regions = torch.zeros(size, dtype=torch.long)
    if shift:
        regions[size - M:size - shift] = 1
        regions[size - shift:] = 2
    return regions


def shifted_window_mask(H: int, W: int, M: int, shift: tuple[int, int]) -> torch.Tensor:
    """Figure 4's masked MSA: (H/M * W/M, M*M, M*M) True where a query may attend to a key, that is,
    both lie in the same region of the cyclically shifted H x W map (a sub-window that was contiguous
    before the shift)."""
    region = shift_regions(H, M, shift[0])[:, None] * 3 + shift_regions(W, M, shift[1])  # (H, W), 9 regions
    windows = window_partition(region[None, :, :, None], M)[..., 0]  # (nW, M*M)
    return windows[:, :, None] == windows[:, None, :]  # (nW, M*M, M*M)


def relative_position_index(M: int) -> torch.Tensor:
    """(M*M, M*M): for a query i and a key j of one window, the row of B_hat holding their bias, (dy, dx)
    with dy, dx in [-M+1, M-1] each, as (dy + M - 1) * (2M - 1) + (dx + M - 1) (Section 3.2)."""
    coords = torch.stack(torch.meshgrid(torch.arange(M), torch.arange(M), indexing="ij")).flatten(1)  # (2, M*M)
    d = coords[:, :, None] - coords[:, None, :] + (M - 1)  # (2, M*M, M*M), each in [0, 2M-2]
    return d[0] * (2 * M - 1) + d[1]  # (M*M, M*M)


class WindowAttention(nn.Module):
    """Multi-head self-attention within windows, with a relative position bias (Eq. 4):
    Attention(Q, K, V) = SoftMax(Q K^T / sqrt(d) + B) V.

    Args:
        dim: the stage's width C.
        num_heads: heads; each has d = C / heads (32 in the paper's flavors).
        M: the window's side.
        dropout: dropout after the output projection.
    """

    def __init__(self, dim: int, num_heads: int, M: int, dropout: float = 0.0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"width {dim} does not divide into {num_heads} heads")
        self.num_heads, self.head_dim, self.M = num_heads, dim // num_heads, M
        self.W_qkv = nn.Linear(dim, 3 * dim)  # qkv: the queries, keys and values of every head at once
        # B_hat in R^{(2M-1) x (2M-1)} per head, a table that the relative positions index into
        # (relative_position_bias_table); an nn.Embedding so that tensor parallelism splits it by heads
        self.B_hat = nn.Embedding((2 * M - 1) ** 2, num_heads)
        self.register_buffer("relative_position_index", relative_position_index(M), persistent=False)
        self.W_o = nn.Linear(dim, dim)  # proj
        self.dropout = nn.Dropout(dropout)

    def relative_position_bias(self) -> torch.Tensor:
        """B of Eq. 4, (heads, M*M, M*M), each entry taken from B_hat by the pair's relative position."""
        return rearrange(self.B_hat(self.relative_position_index), "n m h -> h n m")

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attend within each window of x (B * nW, M*M, C); mask (nW, M*M, M*M), True where a query may
        attend to a key (shifted windows, Figure 4), None where all may."""
        qkv = self.W_qkv(x)  # (B nW, N, 3C)
        # the heads counted from the width (a rank of a tensor-parallel run holds some of them)
        q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, d=self.head_dim)  # (B nW, h, N, d)
        attn = (q * self.head_dim ** -0.5) @ k.transpose(-2, -1) + self.relative_position_bias()  # (B nW, h, N, N)
        if mask is not None:  # regions of a shifted window that were not adjacent attend to nothing of each other
            nW, N = mask.shape[0], mask.shape[-1]
            attn = attn.view(-1, nW, attn.shape[1], N, N)  # (B, nW, h, N, N)
            attn = attn + torch.where(mask, 0.0, MASKED).to(attn.dtype)[None, :, None]  # (B, nW, h, N, N)
            attn = attn.view(-1, attn.shape[2], N, N)  # (B nW, h, N, N)
        a = attn.softmax(dim=-1) @ v  # (B nW, h, N, d)
        return self.dropout(self.W_o(rearrange(a, "b h n d -> b n (h d)")))  # (B nW, N, C)


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth (Huang et al. 2016): in training, the residual branch of each sample dropped with
    probability p and the others scaled by 1 / (1 - p)."""
    if not training or p == 0.0:
        return x
    keep = x.new_empty(x.shape[0], *(1,) * (x.ndim - 1)).bernoulli_(1 - p)  # (B, 1, 1, 1)
    return x * keep / (1 - p)


class SwinTransformerBlock(nn.Module):
    """A Swin Transformer block (Figure 3b, Eq. 3): W-MSA, or SW-MSA with the windows shifted by
    (M/2, M/2), then the MLP, each after a LayerNorm and with a residual connection.

    Args:
        dim: the stage's width C.
        num_heads: attention heads.
        M: the window's side.
        shifted: SW-MSA (every second block of a stage) rather than W-MSA.
        mlp_ratio: the MLP's hidden units over C (alpha = 4).
        drop_path: this block's stochastic depth rate.
        dropout: dropout after the attention's projection and the MLP's layers.
    """

    def __init__(self, dim: int, num_heads: int, M: int, shifted: bool, mlp_ratio: float = 4.0,
                 drop_path: float = 0.0, dropout: float = 0.0):
        super().__init__()
        self.M, self.shift = M, (M // 2 if shifted else 0)
        self.drop_path = drop_path
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, num_heads, M, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, int(dim * mlp_ratio), dropout)

    def shifts(self, H_p: int, W_p: int) -> tuple[int, int]:
        """The displacement along each side of an H_p x W_p map (whole windows): M/2 in SW-MSA, but none
        along a side that one window covers, where shifting would only split that window."""
        return (self.shift if H_p > self.M else 0, self.shift if W_p > self.M else 0)

    def window_msa(self, x: torch.Tensor) -> torch.Tensor:
        """W-MSA or SW-MSA of a normalised map x (B, H, W, C), with its efficient batch computation for
        the shifted configuration (Section 3.2, Figure 4): a cyclic shift, masked MSA, the reverse shift."""
        _, H, W, _ = x.shape
        M = self.M
        x = F.pad(x, (0, 0, 0, -W % M, 0, -H % M))  # (B, H_p, W_p, C), whole windows
        H_p, W_p = x.shape[1], x.shape[2]
        s_h, s_w = self.shifts(H_p, W_p)
        mask = None
        if s_h or s_w:
            x = torch.roll(x, shifts=(-s_h, -s_w), dims=(1, 2))  # cyclic shift toward the top-left
            mask = shifted_window_mask(H_p, W_p, M, (s_h, s_w)).to(x.device)  # (nW, M*M, M*M)
        windows = self.attn(window_partition(x, M), mask)  # (B nW, M*M, C)
        x = window_reverse(windows, M, H_p, W_p)  # (B, H_p, W_p, C)
        if s_h or s_w:
            x = torch.roll(x, shifts=(s_h, s_w), dims=(1, 2))  # reverse cyclic shift
        return x[:, :H, :W]  # (B, H, W, C)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z = z + drop_path(self.window_msa(self.norm1(z)), self.drop_path, self.training)  # z^_l, Eq. 3
        return z + drop_path(self.mlp(self.norm2(z)), self.drop_path, self.training)  # z_l, Eq. 3


class PatchMerging(nn.Module):
    """Patch merging (Section 3.1): the features of each group of 2 x 2 neighbouring patches
    concatenated, 4C, and a linear layer to 2C; the map halves, a downsampling by 2. An odd side is
    padded with zeros first."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, H, W, _ = x.shape
        x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))  # (B, H + H%2, W + W%2, C)
        # the released code's order of the four: (0, 0), (1, 0), (0, 1), (1, 1) as (row, column) offsets
        x = rearrange(x, "b (h dh) (w dw) c -> b h w (dw dh c)", dh=2, dw=2)  # (B, H/2, W/2, 4C)
        return self.reduction(self.norm(x))  # (B, H/2, W/2, 2C)


class PatchEmbedding(nn.Module):
    """Patch partition into P x P patches, each patch's P*P*C_in raw values a feature vector, and a
    linear embedding to C (Section 3.1), then a LayerNorm (the released code's patch_norm)."""

    def __init__(self, patch_size: int, in_chans: int, dim: int):
        super().__init__()
        self.patch_size = patch_size
        self.E = nn.Linear(patch_size * patch_size * in_chans, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        P = self.patch_size
        _, _, H, W = images.shape
        if H % P or W % P:
            raise ValueError(f"image size {H}x{W} is not a multiple of the patch size {P}")
        x_p = rearrange(images, "b c (h p1) (w p2) -> b h w (p1 p2 c)", p1=P, p2=P)  # (B, H/P, W/P, P*P*C_in)
        return self.norm(self.E(x_p))  # (B, H/P, W/P, C)


class SwinTransformer(ClassifierMixin, nn.Module):
    """The Swin Transformer classifier of Figure 3: patch partition and linear embedding, then stages of
    Swin Transformer blocks with patch merging before each stage but the first, a LayerNorm, global
    average pooling and a linear head.

    Args:
        in_chans: input channels.
        num_classes: outputs of the head.
        patch_size: P (4 in the paper).
        embed_dim: C, the first stage's width; stage i has 2^i C.
        depths: blocks per stage (Swin-T: 2, 2, 6, 2).
        num_heads: heads per stage (C / 32 times 1, 2, 4, 8 in the paper).
        window_size: M (7 in the paper).
        mlp_ratio: alpha, the MLP's hidden units over the width (4).
        drop_path: the stochastic depth rate of the last block, rising linearly from 0 at the first
            (0.2, 0.3, 0.5 for Swin-T, S, B on ImageNet-1K, Section 4.1).
        dropout: dropout after the attention's projection and the MLP's layers (0 in the paper).
        shift: False for W-MSA in every block, the "w/o shifting" rows of Table 4 (same parameters).
    """

    classifier_name = "head"  # get_classifier, reset_classifier: common.layers.ClassifierMixin

    def __init__(self, in_chans: int = 3, num_classes: int = 1000, patch_size: int = 4, embed_dim: int = 96,
                 depths: tuple[int, ...] = (2, 2, 6, 2), num_heads: tuple[int, ...] = (3, 6, 12, 24),
                 window_size: int = 7, mlp_ratio: float = 4.0, drop_path: float = 0.2, dropout: float = 0.0,
                 shift: bool = True):
        super().__init__()
        if not isinstance(shift, bool):
            raise ValueError(f"shift must be True or False, got {shift!r}")
        if len(depths) != len(num_heads):
            raise ValueError(f"depths {tuple(depths)} and num_heads {tuple(num_heads)} name different stage counts")
        self.in_chans, self.patch_size, self.window_size, self.shift = in_chans, patch_size, window_size, shift
        self.input_multiple = patch_size  # image sides must divide into patches
        self.patch_embed = PatchEmbedding(patch_size, in_chans, embed_dim)
        n = sum(depths)
        rates = [drop_path * i / max(n - 1, 1) for i in range(n)]  # stochastic depth, 0 to drop_path
        blocks, dim = [], embed_dim
        for i, (depth, heads) in enumerate(zip(depths, num_heads)):
            if i > 0:
                blocks.append(PatchMerging(dim))  # (B, H, W, C) -> (B, H/2, W/2, 2C)
                dim *= 2
            for j in range(depth):
                blocks.append(SwinTransformerBlock(dim, heads, window_size, shifted=shift and j % 2 == 1,
                                                   mlp_ratio=mlp_ratio, drop_path=rates.pop(0), dropout=dropout))
        self.blocks = nn.ModuleList(blocks)  # Figure 3's chain: stage 1's blocks, merging, stage 2's, ...
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The released code's initialisation: linear weights and the bias tables from a normal
        distribution truncated at two standard deviations, std 0.02; biases 0; LayerNorms 1 and 0."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.trunc_normal_(m.weight, std=0.02)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def no_weight_decay(self) -> set[str]:
        """The relative position bias tables, which the released code keeps out of weight decay."""
        return {f"{name}.weight" for name, m in self.named_modules() if isinstance(m, nn.Embedding)}

    def init_classifier(self, layer: nn.Linear) -> None:
        """A new head (reset_classifier) starts as the paper's: truncated normal, std 0.02, zero bias."""
        nn.init.trunc_normal_(layer.weight, std=0.02)
        nn.init.zeros_(layer.bias)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images)  # (B, H/P, W/P, C)
        for block in self.blocks:
            x = block(x)  # (B, H/(P 2^i), W/(P 2^i), 2^i C) in stage i + 1
        return self.norm(x)  # (B, h, w, 2^(S-1) C)

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(reduce(x, "b h w c -> b c", "mean"))  # global average pooling, then the head

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Classify images (B, C_in, H, W), H and W multiples of the patch size, into logits (B, classes)."""
        return self.forward_head(self.forward_features(images))


# The paper's sizes (Section 3.3; 224x224 images, 1000 classes): C = 96, 128, 192, heads of d = 32, M = 7,
# alpha = 4; the stochastic depth of Section 4.1 (Swin-L's, 0.2, from its ImageNet-22K pre-training, A2.2).
# "tiny": 28x28 grey images such as Fashion-MNIST's. Patches of 2 and M = 7 give a 14 x 14 map in stage 1,
# 2 x 2 windows that the shifted blocks displace by 3, and a 7 x 7 map in stage 2, one window, which (as
# Swin-T's last stage at 224x224) is not shifted. Patches of 4 would make stage 1 a single 7 x 7 window,
# where shifting does nothing. C = 32 with heads of d = 16 (two heads, so that --tp 2 splits them): C = 64
# with the paper's d = 32 trained 3.6 times slower here (30 against 109 samples/s, one process).
FLAVORS = {
    "tiny": dict(in_chans=1, num_classes=10, patch_size=2, embed_dim=32, depths=(2, 2), num_heads=(2, 4),
                 window_size=7, drop_path=0.1),
    "swin_t": dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), drop_path=0.2),
    "swin_s": dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24), drop_path=0.3),
    "swin_b": dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32), drop_path=0.5),
    "swin_l": dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48), drop_path=0.2),
}
