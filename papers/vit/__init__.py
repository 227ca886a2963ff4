"""ViT: Dosovitskiy et al., 2020. The spec, and weight loading from timm."""

import torch

from papers import PaperSpec, PipelineChain, ReferenceModel
from papers.vit.model import FLAVORS, VisionTransformer


def timm_names(depth: int) -> dict[str, str]:
    """Our ViT's tensor names -> timm's (class token, learned position embeddings, `depth` blocks)."""
    ours_to_theirs = {"E.weight": "patch_embed.proj.weight", "E.bias": "patch_embed.proj.bias",
                      "x_class": "cls_token", "E_pos": "pos_embed"}
    for part in ("norm", "head"):
        ours_to_theirs |= {f"{part}.{p}": f"{part}.{p}" for p in ("weight", "bias")}
    block_names = {"norm1": "norm1", "msa.W_qkv": "attn.qkv", "msa.W_o": "attn.proj", "norm2": "norm2",
                   "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
    for i in range(depth):
        for ours, theirs in block_names.items():
            ours_to_theirs |= {f"blocks.{i}.{ours}.{p}": f"blocks.{i}.{theirs}.{p}" for p in ("weight", "bias")}
    return ours_to_theirs


def from_timm(timm_vit) -> VisionTransformer:
    """Our ViT holding the weights of a timm `VisionTransformer` (class token, token pooling).

    Args:
        timm_vit: a timm VisionTransformer with a class token, learned position
            embeddings, global_pool="token" and nothing the paper has not (no
            register tokens, layer scale, qk-norm or pre-norm).
    """
    depth = len(timm_vit.blocks)
    ours_to_theirs = timm_names(depth)
    src = timm_vit.state_dict()
    if set(src) != set(ours_to_theirs.values()) or getattr(timm_vit, "global_pool", "token") != "token":
        odd = sorted(set(src) ^ set(ours_to_theirs.values()))[:3]
        raise ValueError(f"this timm ViT has parts the paper's ViT has not ({odd}, global_pool="
                         f"{getattr(timm_vit, 'global_pool', None)!r}); use token pooling and no extras")

    D, C, P, _ = src["patch_embed.proj.weight"].shape
    model = VisionTransformer(
        img_size=tuple(timm_vit.patch_embed.img_size), patch_size=P, in_chans=C,
        num_classes=src["head.weight"].shape[0], dim=D, depth=depth,
        num_heads=timm_vit.blocks[0].attn.num_heads, mlp_dim=src["blocks.0.mlp.fc1.weight"].shape[0],
    )
    state = {ours: src[theirs] for ours, theirs in ours_to_theirs.items()}
    # a P x P convolution with stride P is the linear map E on patches flattened as (p1 p2 c)
    state["E.weight"] = state["E.weight"].permute(0, 2, 3, 1).reshape(D, P * P * C)
    with torch.no_grad():
        model.load_state_dict(state)  # strict: every tensor of ours is set
    return model


def readout(vit: VisionTransformer, z: torch.Tensor) -> torch.Tensor:
    """The pipeline's last stage: y = LN(z_L^0) (Eq. 4), then the head."""
    return vit.forward_head(vit.norm(z))


PAPER = PaperSpec(
    name="vit",
    family="transformer",
    title="An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale",
    authors="Dosovitskiy, Beyer, Kolesnikov, Weissenborn, Zhai, Unterthiner, Dehghani, Minderer, Heigold, Gelly, Uszkoreit, Houlsby",
    year=2020,
    url="https://arxiv.org/abs/2010.11929",
    model=VisionTransformer,
    flavors=FLAVORS,
    inputs="image",
    task="classification",
    defaults=dict(dataset="digits", epochs=30, batch_size=64, lr=5e-4, weight_decay=0.05, warmup_steps=50,
                  label_smoothing=0.1, clip_grad=1.0),
    reference="timm VisionTransformer (class token, learned position embedding, token pooling)",
    data_kwargs=("num_classes", "in_chans", "img_size"),
    shard_blocks="blocks",
    # Megatron-LM's split of a Transformer block: the attention's heads and the MLP's hidden units
    tp_plan={"msa.W_qkv": "colwise-qkv", "msa.W_o": "rowwise", "mlp.fc1": "colwise", "mlp.fc2": "rowwise",
             "norm1": "norm", "norm2": "norm"},
    pipeline=PipelineChain(embed=lambda vit, images: vit.embed(images), readout=readout,
                           first=("E", "x_class", "E_pos", "dropout"), last=("norm", "head")),
    padded_batches=True,
    pretrained={"timm": from_timm},
    reference_models=(ReferenceModel("timm:vit_base_patch16_224", (64, 1, 8, 8),  # the tiny flavor's sizes
                                     dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=128,
                                          depth=2, num_heads=4, mlp_ratio=2.0)),
                      ReferenceModel("timm:vit_base_patch16_224", (2, 3, 224, 224))),
)
