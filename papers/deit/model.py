"""Training data-efficient image transformers & distillation through attention.

Touvron, Cord, Douze, Massa, Sablayrolles, Jégou, 2021. https://arxiv.org/abs/2012.12877

DeiT is ViT (papers/vit) trained on ImageNet alone, which a strong recipe makes possible: heavy
augmentation (RandAugment, Mixup, CutMix, random erasing, repeated augmentation), stochastic depth,
AdamW with a large weight decay (Table 9). DeiT⚗ adds a distillation token: a second learned token
beside the class token, through the same encoder, whose final state feeds a head of its own that
learns the teacher's predictions (Section 4, Fig. 2); at test time the two heads' logits are
averaged ("late fusion", Table 3's "DeiT⚗: class+distillation"). The losses are common.tasks'
(`hard_distillation`, `soft_distillation`); the teacher is a finished run (`--teacher RUN_DIR`).
"""

import torch
import torch.nn as nn

from papers.vit.model import EncoderBlock, VisionTransformer

INFERENCE = ("both", "class", "distillation")  # which head(s) classify at test time (Table 3's last rows)


class DropPath(nn.Module):
    """Stochastic depth (Huang et al., 2016), "drop path" in DeiT's code: in training, a residual branch
    is dropped for a whole sample with probability p, and scaled by 1 / (1 - p) when kept."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = x.new_empty(x.shape[0], *(1,) * (x.ndim - 1)).bernoulli_(1 - self.p)  # (B, 1, 1)
        return x * keep / (1 - self.p)


class Block(EncoderBlock):
    """ViT's encoder layer (Eq. 2-3 of ViT) with stochastic depth on each residual branch."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, dropout: float = 0.0, drop_path: float = 0.0):
        super().__init__(dim, num_heads, mlp_dim, dropout)
        self.drop_path = DropPath(drop_path)

    def forward(self, z: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        z = self.drop_path(self.msa(self.norm1(z), attn_mask)) + z  # (B, T, D)
        z = self.drop_path(self.mlp(self.norm2(z))) + z  # (B, T, D)
        return z


class DeiT(VisionTransformer):
    """DeiT, and with `distilled=True` DeiT⚗ (a distillation token and head).

    Args:
        img_size, patch_size, in_chans, num_classes, dim, depth, num_heads, mlp_dim, dropout: ViT's
            (papers.vit.model.VisionTransformer); DeiT uses no dropout (Table 9).
        drop_path: stochastic depth of the last block; block l drops with l / (depth - 1) of it
            (DeiT's code, timm's linear rule). 0.1 in Table 9.
        distilled: add the distillation token x_dist and its head (DeiT⚗).
        inference: DeiT⚗ at test time: "both" (the average of the two heads' logits, the paper's),
            "class" or "distillation" (one head alone, Table 3's rows "class embedding" and
            "distil. embedding").

    In training DeiT⚗ returns {"logits": the class head's, "distillation": the distillation head's},
    which common.tasks' distillation losses read; in eval mode the logits `inference` names.
    """

    takes_teacher = True  # --teacher RUN_DIR trains it with common.tasks' distillation losses

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
        drop_path: float = 0.0,
        distilled: bool = False,
        inference: str = "both",
    ):
        if inference not in INFERENCE:
            raise ValueError(f"inference must be one of {', '.join(INFERENCE)}, got {inference!r}")
        if not 0.0 <= drop_path < 1.0:
            raise ValueError(f"drop_path must be in [0, 1), got {drop_path}")
        self.distilled, self.inference = distilled, inference
        # common.pipeline refuses --pp for DeiT⚗, whose last stage would send a dict of the two heads' logits
        self.pipeline_refusal = ("DeiT⚗ returns its two heads' logits in training, which a pipeline's last stage "
                                 "cannot hand on as one tensor; train it without --pp" if distilled else None)
        super().__init__(img_size, patch_size, in_chans, num_classes, dim, depth, num_heads, mlp_dim, dropout)
        rates = [drop_path * l / max(depth - 1, 1) for l in range(depth)]  # linear in depth, 0 to drop_path
        self.blocks = nn.ModuleList(Block(dim, num_heads, mlp_dim, dropout, rate) for rate in rates)
        if distilled:
            self.x_dist = nn.Parameter(torch.zeros(1, 1, dim))  # the distillation token
            self.E_pos_dist = nn.Parameter(torch.zeros(1, 1, dim))  # its position embedding
            self.head_dist = nn.Linear(dim, num_classes)  # its own head
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """DeiT's code: tokens, position embeddings and linear weights from a truncated normal (std 0.02),
        biases zero; the patch embedding keeps a convolution's default initialisation (our E is that
        convolution as a linear map, whose default initialisation is the same)."""
        nn.init.trunc_normal_(self.E_pos, std=0.02)
        nn.init.trunc_normal_(self.x_class, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.E.reset_parameters()
        if getattr(self, "x_dist", None) is not None:  # (not yet during ViT's constructor)
            nn.init.trunc_normal_(self.x_dist, std=0.02)
            nn.init.trunc_normal_(self.E_pos_dist, std=0.02)

    def no_weight_decay(self) -> set[str]:
        return {"x_class", "E_pos", "x_dist", "E_pos_dist"}

    def init_classifier(self, layer: nn.Linear) -> None:
        """A new head starts as DeiT's heads do: truncated normal weights (std 0.02), zero biases."""
        nn.init.trunc_normal_(layer.weight, std=0.02)
        nn.init.zeros_(layer.bias)

    def reset_classifier(self, num_classes: int) -> None:
        """New heads for num_classes: the class head and, in DeiT⚗, the distillation head."""
        super().reset_classifier(num_classes)
        if self.distilled:
            self.head_dist = self.new_classifier(self.head_dist, num_classes)

    def embed(self, images: torch.Tensor, grids: list[tuple[int, int]] | None = None) -> torch.Tensor:
        """z_0: ViT's [class token, patches] with, in DeiT⚗, the distillation token after the class token
        (Fig. 2), each plus its position embedding: (B, 1+N, D), or (B, 2+N, D)."""
        z = super().embed(images, grids)  # (B, 1+N, D)
        if not self.distilled:
            return z
        x_dist = self.dropout(self.x_dist + self.E_pos_dist).expand(z.shape[0], -1, -1)  # (B, 1, D)
        return torch.cat([z[:, :1], x_dist, z[:, 1:]], dim=1)  # (B, 2+N, D)

    def forward_head(self, z: torch.Tensor):
        y_class = self.head(z[:, 0])  # the class token's logits, (B, classes)
        if not self.distilled:
            return y_class
        y_dist = self.head_dist(z[:, 1])  # the distillation token's, (B, classes)
        if self.training:
            return {"logits": y_class, "distillation": y_dist}
        if self.inference == "class":
            return y_class
        if self.inference == "distillation":
            return y_dist
        return (y_class + y_dist) / 2  # late fusion of the two heads' logits (Section 4)


def deit(dim: int, num_heads: int, **kwargs) -> dict:
    """A DeiT size of Table 1: 224x224 images, patches of 16, 12 layers, MLP ratio 4, drop path 0.1."""
    return dict(patch_size=16, dim=dim, depth=12, num_heads=num_heads, mlp_dim=4 * dim, drop_path=0.1, **kwargs)


# "tiny" (the repo's: 28x28 Fashion-MNIST in 4x4 patches, as ViT's tiny/4), then Table 1's sizes at 224x224
# and 1000 classes, and DeiT⚗ (a distillation token) of each.
FLAVORS = {
    "tiny": dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, dim=128, depth=2, num_heads=4,
                 mlp_dim=256, drop_path=0.1),
    "tiny-distilled": dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, dim=128, depth=2, num_heads=4,
                           mlp_dim=256, drop_path=0.1, distilled=True),
    "deit_ti": deit(192, 3),
    "deit_s": deit(384, 6),
    "deit_b": deit(768, 12),
    "deit_ti_distilled": deit(192, 3, distilled=True),
    "deit_s_distilled": deit(384, 6, distilled=True),
    "deit_b_distilled": deit(768, 12, distilled=True),
}
