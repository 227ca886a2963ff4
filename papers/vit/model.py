"""An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale.

Dosovitskiy et al., 2020. https://arxiv.org/abs/2010.11929

An image is cut into fixed-size patches, each patch is flattened and linearly
embedded, a learnable class token and position embeddings are added, and the
sequence goes through a standard pre-norm Transformer encoder (Eq. 1-4). The
class token's final state, layer-normalised, is classified by a linear head.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange


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
        self.num_heads = num_heads
        self.W_qkv = nn.Linear(dim, 3 * dim)  # U_qkv of Appendix A, all heads at once
        self.W_o = nn.Linear(dim, dim)  # U_msa
        self.dropout = nn.Dropout(dropout)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        qkv = self.W_qkv(z)  # (B, N, 3D)
        q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
        a = F.scaled_dot_product_attention(q, k, v)  # (B, h, N, D_h)
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

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z = self.msa(self.norm1(z)) + z  # z'_l = MSA(LN(z_{l-1})) + z_{l-1}
        z = self.mlp(self.norm2(z)) + z  # z_l = MLP(LN(z'_l)) + z'_l
        return z


class VisionTransformer(nn.Module):
    """ViT classifier.

    Args:
        img_size: input side length H = W (pixels).
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

    def __init__(
        self,
        img_size: int = 224,
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
        if img_size % patch_size:
            raise ValueError(f"image size {img_size} is not a multiple of the patch size {patch_size}")
        self.patch_size = patch_size
        num_patches = (img_size // patch_size) ** 2
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

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        p = self.patch_size
        x_p = rearrange(images, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p)  # (B, N, P^2 C)
        x_class = self.x_class.expand(images.shape[0], -1, -1)  # (B, 1, D)
        z = self.dropout(torch.cat([x_class, self.E(x_p)], dim=1) + self.E_pos)  # z_0, (B, 1+N, D)
        for block in self.blocks:
            z = block(z)
        return self.norm(z)  # (B, 1+N, D)

    def forward_head(self, z: torch.Tensor) -> torch.Tensor:
        return self.head(z[:, 0])  # y = LN(z_L^0), then the head, (B, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Classify a batch of images (B, C, H, W) into logits (B, classes)."""
        return self.forward_head(self.forward_features(images))


# The paper's Table 1 (at 224x224, 1000 classes) and the repo's own tiny flavor for 8x8 digits.
FLAVORS = {
    "tiny": dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, dim=128, depth=2, num_heads=4, mlp_dim=256),
    "ViT-B/16": dict(patch_size=16, dim=768, depth=12, num_heads=12, mlp_dim=3072),
    "ViT-L/16": dict(patch_size=16, dim=1024, depth=24, num_heads=16, mlp_dim=4096),
    "ViT-H/14": dict(patch_size=14, dim=1280, depth=32, num_heads=16, mlp_dim=5120),
}
