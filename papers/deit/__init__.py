"""DeiT: Touvron et al., 2021. The spec, and weight loading from timm."""

import torch

from papers import PaperSpec, PipelineChain, ReferenceModel
from papers.deit.model import FLAVORS, DeiT
from papers.vit import readout, timm_names

DISTILLED = {"x_dist": "dist_token", "head_dist.weight": "head_dist.weight", "head_dist.bias": "head_dist.bias"}


def from_timm(timm_deit) -> DeiT:
    """Our DeiT holding the weights of timm's DeiT: `deit_*_patch16_224` (a timm VisionTransformer) or
    `deit_*_distilled_patch16_224` (a VisionTransformerDistilled: the distillation token and head).

    Args:
        timm_deit: a timm VisionTransformer with a class token (and maybe a distillation token), learned
            position embeddings over every token, global_pool="token" and nothing DeiT has not (no register
            tokens, layer scale, qk-norm, pre-norm or DeiT III's position embeddings without the tokens').

    Raises:
        ValueError: naming what does not map.
    """
    depth, src = len(timm_deit.blocks), timm_deit.state_dict()
    distilled = "dist_token" in src
    ours_to_theirs = timm_names(depth) | (DISTILLED if distilled else {})
    extra = sorted(set(src) ^ set(ours_to_theirs.values()))  # (E_pos_dist is cut from timm's pos_embed)
    prefix = 2 if distilled else 1
    pool = getattr(timm_deit, "global_pool", "token")
    own_positions = src.get("pos_embed", torch.zeros(1, 0, 0)).shape[1] == timm_deit.patch_embed.num_patches + prefix
    if extra or pool != "token" or not own_positions or getattr(timm_deit, "num_prefix_tokens", prefix) != prefix:
        raise ValueError(f"this timm model has parts DeiT has not ({extra[:3]}, global_pool={pool!r}, position "
                         f"embeddings for the class and distillation tokens: {own_positions}); use timm's deit_* models")

    D, C, P, _ = src["patch_embed.proj.weight"].shape
    model = DeiT(img_size=tuple(timm_deit.patch_embed.img_size), patch_size=P, in_chans=C,
                 num_classes=src["head.weight"].shape[0], dim=D, depth=depth,
                 num_heads=timm_deit.blocks[0].attn.num_heads, mlp_dim=src["blocks.0.mlp.fc1.weight"].shape[0],
                 distilled=distilled)
    state = {ours: src[theirs] for ours, theirs in ours_to_theirs.items()}
    # a P x P convolution with stride P is the linear map E on patches flattened as (p1 p2 c)
    state["E.weight"] = state["E.weight"].permute(0, 2, 3, 1).reshape(D, P * P * C)
    if distilled:  # timm's positions are [class, distillation, patches]; ours keep the distillation token's apart
        pos = state["E_pos"]
        state["E_pos"], state["E_pos_dist"] = torch.cat([pos[:, :1], pos[:, 2:]], dim=1), pos[:, 1:2]
    with torch.no_grad():
        model.load_state_dict(state)  # strict: every tensor of ours is set
    return model


def embed(deit: DeiT, images: torch.Tensor) -> torch.Tensor:
    """The pipeline's first stage: z_0, the class (and distillation) token and the patches."""
    return deit.embed(images)


PAPER = PaperSpec(
    name="deit",
    family="transformer",
    title="Training data-efficient image transformers & distillation through attention",
    authors="Touvron, Cord, Douze, Massa, Sablayrolles, Jégou",
    year=2021,
    url="https://arxiv.org/abs/2012.12877",
    model=DeiT,
    flavors=FLAVORS,
    inputs="image",
    task="classification",
    # ViT's (the repo's recipe): AdamW, lr 5e-4 at batch 64, warmup, cosine, smoothing 0.1
    defaults=dict(dataset="digits", epochs=30, batch_size=64, lr=5e-4, weight_decay=0.05,
                  warmup_steps=50, label_smoothing=0.1, clip_grad=0.0),
    # Table 9, as far as it applies at this scale: 300 epochs at batch 1024, AdamW with lr 5e-4 x batch / 512
    # (1e-3 at 1024; --lr-scaling linear keeps the rule at other batches), weight decay 0.05, cosine after a
    # 5-epoch warmup (290 steps: 5 epochs of Fashion-MNIST's 58 at batch 1024), label smoothing 0.1, drop path
    # 0.1 (the flavors'), RandAugment 9/0.5, Mixup 0.8, CutMix 1.0, random erasing 0.25 and repeated
    # augmentation x3 (--augment, common.data.augment); no gradient clipping, no dropout
    recipe=dict(optimizer="adamw", lr=1e-3, batch_size=1024, epochs=300, weight_decay=0.05, schedule="cosine",
                warmup_steps=290, label_smoothing=0.1, clip_grad=0.0,
                augment="randaug:9-0.5,erase:0.25,mixup:0.8,cutmix:1.0,repeat:3"),
    reference="timm deit_*_patch16_224 and deit_*_distilled_patch16_224 (VisionTransformerDistilled)",
    data_kwargs=("num_classes", "in_chans", "img_size"),
    shard_blocks="blocks",
    # ViT's: Megatron-LM's split of a Transformer block
    tp_plan={"msa.W_qkv": "colwise-qkv", "msa.W_o": "rowwise", "mlp.fc1": "colwise", "mlp.fc2": "rowwise",
             "norm1": "norm", "norm2": "norm"},
    pipeline=PipelineChain(embed=embed, readout=readout, first=("E", "x_class", "E_pos", "dropout"),
                           last=("norm", "head")),
    padded_batches=True,
    pretrained={"timm": from_timm},
    reference_models=(ReferenceModel("timm:deit_tiny_patch16_224", (64, 1, 28, 28),  # the tiny flavor's sizes
                                     dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=128,
                                          depth=2, num_heads=4, mlp_ratio=2.0)),
                      ReferenceModel("timm:deit_tiny_distilled_patch16_224", (2, 3, 224, 224))),
)
