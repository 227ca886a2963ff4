"""An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale.

Dosovitskiy et al., 2020. https://arxiv.org/abs/2010.11929

An image is cut into fixed-size patches, each patch is flattened and linearly
embedded, a learnable class token and position embeddings are added, and the
sequence goes through a standard pre-norm Transformer encoder (Eq. 1-4). The
class token's final state, layer-normalised, is classified by a linear head.
Images of another size use the position embeddings 2D-interpolated to their
patch grid (Section 3.2); a padded batch masks each sample's padding out.
"""

from collections import defaultdict

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from common.layers import ClassifierMixin


class MultiHeadSelfAttention(nn.Module):
    """MSA of Eq. 2: softmax(q k^T / sqrt(D_h)) v for every head, then a projection.

    Args:
        dim: model width D.
        num_heads: number of heads k; each has D_h = D / k.
        dropout: dropout after the output projection.
    """

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"width {dim} does not divide into {num_heads} heads")
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.W_qkv = nn.Linear(dim, 3 * dim)  # U_qkv of Appendix A, all heads at once
        self.W_o = nn.Linear(dim, dim)  # U_msa
        self.dropout = nn.Dropout(dropout)

    def forward(self, z: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attend over the sequence z (B, N, D); attn_mask (B, 1, 1, N), True on the keys to attend to."""
        qkv = self.W_qkv(z)  # (B, N, 3D)
        # the heads counted from the width (a rank of a tensor-parallel run holds some of them)
        q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, d=self.head_dim)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, h, N, D_h)
        return self.dropout(self.W_o(rearrange(a, "b h n d -> b n (h d)")))  # (B, N, D)


class MLP(nn.Module):
    """The two-layer MLP with a GELU non-linearity, dropout after each dense layer."""

    def __init__(self, dim: int, hidden_dim: int, dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(self.dropout(F.gelu(self.fc1(z)))))


class EncoderBlock(nn.Module):
    """One encoder layer, layernorm before each sub-block and a residual after (Eq. 2-3)."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, dropout: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.msa = MultiHeadSelfAttention(dim, num_heads, dropout)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MLP(dim, mlp_dim, dropout)

    def forward(self, z: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        z = self.msa(self.norm1(z), attn_mask) + z  # z'_l = MSA(LN(z_{l-1})) + z_{l-1}
        z = self.mlp(self.norm2(z)) + z  # z_l = MLP(LN(z'_l)) + z'_l
        return z


class VisionTransformer(ClassifierMixin, nn.Module):
    """ViT classifier.

    Args:
        img_size: the image size H = W (pixels), or (H, W), whose patch grid the position
            embeddings are learned on; other sizes interpolate them (Section 3.2).
        patch_size: patch side P; the sequence has N = HW / P^2 patches.
        in_chans: input channels C.
        num_classes: outputs of the linear head.
        dim: hidden size D (Table 1 "Hidden size").
        depth: number of encoder layers L.
        num_heads: attention heads.
        mlp_dim: hidden units of the MLP (Table 1 "MLP size").
        dropout: applied after every dense layer except the qkv projection, and after
            adding the position embeddings (Appendix B.1).
    """

    classifier_name = "head"  # get_classifier, reset_classifier: common.layers.ClassifierMixin

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_dim: int = 3072,
        dropout: float = 0.0,
    ):
        super().__init__()
        H, W = (img_size, img_size) if isinstance(img_size, int) else img_size
        if H % patch_size or W % patch_size:
            raise ValueError(f"image size {H}x{W} is not a multiple of the patch size {patch_size}")
        self.patch_size, self.in_chans = patch_size, in_chans
        self.input_multiple = patch_size  # image sides must divide into patches (the trainer pads to it)
        self.img_size = (H, W)
        self.grid_size = (H // patch_size, W // patch_size)  # the grid E_pos is learned on
        num_patches = self.grid_size[0] * self.grid_size[1]
        self.E = nn.Linear(patch_size * patch_size * in_chans, dim)  # patch embedding, Eq. 1
        self.x_class = nn.Parameter(torch.zeros(1, 1, dim))  # learnable [class] token
        self.E_pos = nn.Parameter(torch.zeros(1, 1 + num_patches, dim))  # learned 1D positions
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(EncoderBlock(dim, num_heads, mlp_dim, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)  # the LN of Eq. 4
        self.head = nn.Linear(dim, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.E_pos, std=0.02)
        nn.init.normal_(self.x_class, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        nn.init.zeros_(self.head.weight)  # a zero-initialised D x K head, as in Section 3.2

    def no_weight_decay(self) -> set[str]:
        """Embeddings that AdamW leaves without weight decay (norms and biases never get it)."""
        return {"x_class", "E_pos"}

    def init_classifier(self, layer: nn.Linear) -> None:
        """A new head for fine-tuning (reset_classifier): "we remove the pre-trained prediction head and attach a
        zero-initialized D x K feedforward layer, where K is the number of downstream classes" (Section 3.2)."""
        nn.init.zeros_(layer.weight)
        nn.init.zeros_(layer.bias)

    def resize_position_embeddings(self, img_size: int | tuple[int, int]) -> None:
        """Make another image size the learned one: E_pos interpolated to its patch grid once
        (Section 3.2, see `E_pos_grid`), so that images of that size use it as it is."""
        H, W = (img_size, img_size) if isinstance(img_size, int) else img_size
        P = self.patch_size
        if H % P or W % P:
            raise ValueError(f"image size {H}x{W} is not a multiple of the patch size {P}")
        with torch.no_grad():
            patches = rearrange(self.E_pos_grid(H // P, W // P), "h w d -> 1 (h w) d")  # (1, HW/P^2, D)
            E_pos = torch.cat([self.E_pos[:, :1], patches], dim=1)  # (1, 1 + HW/P^2, D), the class token's kept
        self.E_pos = nn.Parameter(E_pos.contiguous(), requires_grad=self.E_pos.requires_grad)
        self.img_size, self.grid_size = (H, W), (H // P, W // P)

    def patch_grids(self, images: torch.Tensor, mask: torch.Tensor | None) -> list[tuple[int, int]] | None:
        """Each sample's valid rectangle counted in patches, (h_i / P, w_i / P).

        Returns None when every sample fills the whole batch (no mask, or an all-True one).
        Raises ValueError when a size does not divide into patches or the mask is not a
        top-left rectangle per sample.
        """
        B, _, H, W = images.shape
        P = self.patch_size
        if H % P or W % P:
            raise ValueError(f"image size {H}x{W} is not a multiple of the patch size {P}")
        if mask is None:
            return None
        if mask.shape != (B, H, W) or mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor of shape {(B, H, W)}, got {mask.dtype} {tuple(mask.shape)}")
        h = mask.any(dim=2).sum(dim=1)  # (B,) valid rows h_i
        w = mask.any(dim=1).sum(dim=1)  # (B,) valid columns w_i
        rows, cols = torch.arange(H, device=mask.device), torch.arange(W, device=mask.device)
        rectangle = (rows[:, None] < h[:, None, None]) & (cols < w[:, None, None])  # (B, H, W)
        if not torch.equal(mask, rectangle):
            raise ValueError("mask must be True on one rectangle per sample, anchored at the top-left corner")
        sizes = [tuple(s) for s in torch.stack([h, w], dim=1).tolist()]
        for i, (h_i, w_i) in enumerate(sizes):
            if h_i == 0 or w_i == 0 or h_i % P or w_i % P:
                raise ValueError(f"sample {i} has {h_i}x{w_i} valid pixels, not a (non-zero) multiple of the "
                                 f"patch size {P}")
        if all(size == (H, W) for size in sizes):
            return None
        return [(h_i // P, w_i // P) for h_i, w_i in sizes]

    def E_pos_grid(self, h: int, w: int) -> torch.Tensor:
        """The patch part of E_pos laid out on an h x w grid, (h, w, D).

        Section 3.2: at another resolution "we perform 2D interpolation of the pre-trained
        position embeddings, according to their location in the original image" (bicubic here,
        without antialiasing). On the learned grid, E_pos is used as it is.
        """
        g_h, g_w = self.grid_size
        grid = rearrange(self.E_pos[0, 1:], "(h w) d -> 1 d h w", h=g_h, w=g_w)  # (1, D, g_h, g_w)
        if torch.compiler.is_exporting() or (h, w) != (g_h, g_w):  # exported graphs serve every size
            grid = F.interpolate(grid, size=(h, w), mode="bicubic", antialias=False, align_corners=False)
        return rearrange(grid, "1 d h w -> h w d")  # (h, w, D)

    def position_embeddings(self, grids: list[tuple[int, int]] | None, H_p: int, W_p: int) -> torch.Tensor:
        """E_pos for a batch whose patch grid is H_p x W_p.

        Args:
            grids: each sample's own grid (h_i, w_i); its position embeddings are placed at the
                top-left of the batch grid, zeros on its padding. None: every sample fills the grid.

        Returns:
            (B, 1 + H_p W_p, D), or (1, 1 + H_p W_p, D) when grids is None. The class token's
            position embedding is the learned one for every grid.
        """
        if grids is None:
            if not torch.compiler.is_exporting() and (H_p, W_p) == self.grid_size:
                return self.E_pos  # (1, 1+N, D)
            patches = self.E_pos_grid(H_p, W_p)[None]  # (1, H_p, W_p, D)
        else:
            patches = self.E_pos.new_zeros(len(grids), H_p, W_p, self.E_pos.shape[-1])  # (B, H_p, W_p, D)
            samples_of = defaultdict(list)  # one interpolation per distinct grid
            for i, grid in enumerate(grids):
                samples_of[grid].append(i)
            for (h, w), samples in samples_of.items():
                patches[samples, :h, :w] = self.E_pos_grid(h, w)  # (h, w, D) to every sample of that grid
        E_pos_class = self.E_pos[:, :1].expand(patches.shape[0], -1, -1)  # (B or 1, 1, D)
        return torch.cat([E_pos_class, rearrange(patches, "b h w d -> b (h w) d")], dim=1)  # (B or 1, 1+N, D)

    def embed(self, images: torch.Tensor, grids: list[tuple[int, int]] | None = None) -> torch.Tensor:
        """z_0 of Eq. 1: the class token and the patches' embeddings E x_p, plus E_pos, (B, 1+N, D);
        `grids` (from patch_grids) places each padded sample's positions on its own grid."""
        B, _, H, W = images.shape
        P = self.patch_size
        x_p = rearrange(images, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=P, p2=P)  # (B, N, P^2 C)
        x_class = self.x_class.expand(B, -1, -1)  # (B, 1, D)
        z = torch.cat([x_class, self.E(x_p)], dim=1) + self.position_embeddings(grids, H // P, W // P)
        return self.dropout(z)

    def forward_features(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, P = images.shape[0], self.patch_size
        grids = self.patch_grids(images, mask)  # [(h_i/P, w_i/P)] or None when nothing is padded
        z = self.embed(images, grids)  # z_0, (B, 1+N, D)
        attn_mask = None
        if grids is not None:  # padded patches are never attended to, so the class token pools valid ones only
            valid = mask[:, ::P, ::P].flatten(1)  # (B, N): a patch is valid iff its top-left pixel is
            tokens = valid.new_ones(B, z.shape[1] - valid.shape[1])  # (B, 1): the class token (and any other)
            attn_mask = torch.cat([tokens, valid], dim=1)[:, None, None, :]  # (B, 1, 1, 1+N) keys
        for block in self.blocks:
            z = block(z, attn_mask)
        return self.norm(z)  # (B, 1+N, D); rows of padded patches are meaningless

    def forward_head(self, z: torch.Tensor) -> torch.Tensor:
        return self.head(z[:, 0])  # y = LN(z_L^0), then the head, (B, classes)

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Classify a batch of images into logits (B, classes).

        Args:
            images: (B, C, H, W), zero-padded; H and W are multiples of the patch size.
            mask: (B, H, W) bool, True on each sample's valid pixels, a top-left rectangle
                whose sides are multiples of the patch size. None: every pixel is valid.
        """
        return self.forward_head(self.forward_features(images, mask))


# The paper's Table 1 (at 224x224, 1000 classes), and the repo's tiny flavors: "tiny" for 8x8 digits (2x2
# patches), "tiny/4" with 4x4 patches for larger images such as digits-canvas.
FLAVORS = {
    "tiny": dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, dim=128, depth=2, num_heads=4, mlp_dim=256),
    "tiny/4": dict(img_size=32, patch_size=4, in_chans=1, num_classes=10, dim=128, depth=2, num_heads=4, mlp_dim=256),
    "ViT-B/16": dict(patch_size=16, dim=768, depth=12, num_heads=12, mlp_dim=3072),
    "ViT-L/16": dict(patch_size=16, dim=1024, depth=24, num_heads=16, mlp_dim=4096),
    "ViT-H/14": dict(patch_size=14, dim=1280, depth=32, num_heads=16, mlp_dim=5120),
}
