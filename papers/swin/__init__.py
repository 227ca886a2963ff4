"""Swin Transformer: Liu et al., 2021. The spec, and weight loading from torchvision and timm."""

import torch
import torch.nn as nn

from papers import PaperSpec, PipelineChain, ReferenceModel
from papers.swin.model import FLAVORS, PatchMerging, SwinTransformer, SwinTransformerBlock


def _square(pair, what: str) -> int:
    if len(set(pair)) != 1:
        raise ValueError(f"cannot map a Swin Transformer with a non-square {what} {list(pair)}; ours is square")
    return pair[0]


def _check_torchvision(tv_model: nn.Module) -> None:
    """A ValueError naming what of a torchvision SwinTransformer the paper's model has not."""
    from torchvision.models.swin_transformer import PatchMerging as TvPatchMerging
    from torchvision.models.swin_transformer import ShiftedWindowAttention
    from torchvision.models.swin_transformer import SwinTransformer as TorchvisionSwin
    from torchvision.models.swin_transformer import SwinTransformerBlock as TvBlock

    if not isinstance(tv_model, TorchvisionSwin):
        raise ValueError(f"expected a torchvision SwinTransformer, got {type(tv_model).__name__}")
    for name, m in tv_model.named_modules():
        if isinstance(m, TvBlock) and (type(m) is not TvBlock or type(m.attn) is not ShiftedWindowAttention):
            raise ValueError(f"cannot map {type(m).__name__} ({name}): Swin Transformer V2's blocks (post-norm, "
                             "cosine attention, a continuous position bias) are not the paper's")
        if isinstance(m, nn.Module) and "PatchMerging" in type(m).__name__ and type(m) is not TvPatchMerging:
            raise ValueError(f"cannot map {type(m).__name__} ({name}); only the paper's patch merging")
        if isinstance(m, nn.LayerNorm) and m.eps != 1e-5:
            raise ValueError(f"cannot map layer norm with eps {m.eps} ({name}); ours uses 1e-5")
        if isinstance(m, ShiftedWindowAttention) and m.attention_dropout:
            raise ValueError(f"cannot map attention dropout ({name}, {m.attention_dropout}); the paper has none")


def _block_names(ours: str, theirs: str) -> dict[str, str]:
    names = {"norm1": "norm1", "attn.W_qkv": "attn.qkv", "attn.W_o": "attn.proj", "norm2": "norm2",
             "mlp.fc1": "mlp.0", "mlp.fc2": "mlp.3"}
    mapping = {f"{ours}.{a}.{p}": f"{theirs}.{b}.{p}" for a, b in names.items() for p in ("weight", "bias")}
    return mapping | {f"{ours}.attn.B_hat.weight": f"{theirs}.attn.relative_position_bias_table"}


def from_torchvision(tv_model: nn.Module) -> SwinTransformer:
    """Our Swin Transformer holding the weights of a torchvision `SwinTransformer` (swin_t, swin_s,
    swin_b, or the same structure with other depths, heads, windows, patches or classes).

    Args:
        tv_model: a `torchvision.models.SwinTransformer` of the paper's (V1) blocks, with square patches
            and windows; V2 blocks, non-square windows, attention dropout or other norms are refused
            with a ValueError.
    """
    _check_torchvision(tv_model)
    stages = [m for m in tv_model.features[1:] if isinstance(m, nn.Sequential)]
    first = stages[0][0]
    M, P = _square(first.attn.window_size, "window"), _square(tv_model.features[0][0].kernel_size, "patch")
    for i, stage in enumerate(stages):
        for j, block in enumerate(stage):
            if list(block.attn.shift_size) != [M // 2 if j % 2 else 0] * 2 or list(block.attn.window_size) != [M, M]:
                raise ValueError(f"cannot map stage {i} block {j}: window {block.attn.window_size}, shift "
                                 f"{block.attn.shift_size}; ours alternate W-MSA and SW-MSA with (M/2, M/2), one M")
    conv = tv_model.features[0][0]
    model = SwinTransformer(
        in_chans=conv.in_channels, num_classes=tv_model.head.out_features, patch_size=P,
        embed_dim=conv.out_channels, depths=tuple(len(s) for s in stages),
        num_heads=tuple(s[0].attn.num_heads for s in stages), window_size=M,
        mlp_ratio=first.mlp[0].out_features / first.mlp[0].in_features,
        drop_path=stages[-1][-1].stochastic_depth.p, dropout=first.attn.dropout)

    ours_to_theirs = {"patch_embed.E.bias": "features.0.0.bias", "patch_embed.norm.weight": "features.0.2.weight",
                      "patch_embed.norm.bias": "features.0.2.bias"}
    for part in ("norm", "head"):
        ours_to_theirs |= {f"{part}.{p}": f"{part}.{p}" for p in ("weight", "bias")}
    for k, (block, where) in enumerate(zip(model.blocks, _torchvision_paths(tv_model), strict=True)):
        if isinstance(block, PatchMerging):
            ours_to_theirs |= {f"blocks.{k}.norm.weight": f"{where}.norm.weight",
                               f"blocks.{k}.norm.bias": f"{where}.norm.bias",
                               f"blocks.{k}.reduction.weight": f"{where}.reduction.weight"}
        else:
            ours_to_theirs |= _block_names(f"blocks.{k}", where)

    src = tv_model.state_dict()
    unmapped = sorted(k for k in set(src) - set(ours_to_theirs.values()) - {"features.0.0.weight"}
                      if not k.endswith("relative_position_index"))
    if unmapped:
        raise ValueError(f"this torchvision Swin Transformer has tensors the paper's has not: {unmapped[:3]}")
    state = {ours: src[theirs] for ours, theirs in ours_to_theirs.items()}
    # a P x P convolution with stride P is the linear embedding of patches flattened as (p1 p2 c)
    state["patch_embed.E.weight"] = src["features.0.0.weight"].permute(0, 2, 3, 1).reshape(conv.out_channels, -1)
    with torch.no_grad():
        model.load_state_dict(state)  # strict: every tensor of ours is set
    return model


def _torchvision_paths(tv_model: nn.Module) -> list[str]:
    """torchvision's name of each of our `blocks` in turn: features.{2s+1}.{j} for stage s's block j,
    features.{2s} for the patch merging before stage s."""
    paths = []
    for k, m in enumerate(tv_model.features):
        if k == 0:
            continue
        paths += [f"features.{k}.{j}" for j in range(len(m))] if isinstance(m, nn.Sequential) else [f"features.{k}"]
    return paths


def _check_timm(timm_swin: nn.Module) -> int:
    """The window M of a timm SwinTransformer, or a ValueError naming what of it the paper's model has not."""
    from timm.models.swin_transformer import SwinTransformer as TimmSwin

    if not isinstance(timm_swin, TimmSwin):
        raise ValueError(f"expected a timm SwinTransformer, got {type(timm_swin).__name__}")
    if timm_swin.global_pool != "avg" or timm_swin.head.drop.p:
        raise ValueError("cannot map a timm Swin Transformer with another pooling than 'avg' or head dropout; the "
                         "paper's averages and has none")
    M = _square(timm_swin.layers[0].blocks[0].window_size, "window")
    for i, stage in enumerate(timm_swin.layers):
        for j, b in enumerate(stage.blocks):
            shift = M // 2 if j % 2 and min(b.input_resolution) > M else 0
            if tuple(b.window_size) != (M, M) or tuple(b.shift_size) != (shift, shift) or b.always_partition:
                raise ValueError(f"cannot map stage {i} block {j} of this timm Swin Transformer: window "
                                 f"{tuple(b.window_size)}, shift {tuple(b.shift_size)} on its {b.input_resolution} "
                                 f"map (timm shrinks a window to a smaller map; ours pads the map to one M x M "
                                 f"window, and uses one M in every stage)")
            if b.attn.attn_drop.p:
                raise ValueError(f"cannot map attention dropout (stage {i} block {j}); the paper has none")
            if b.attn.qkv.out_features != 3 * b.attn.qkv.in_features:
                raise ValueError(f"cannot map heads whose width is not the stage's over the heads (stage {i}, "
                                 f"timm's head_dim); ours have d = C / heads")
    for name, m in timm_swin.named_modules():
        if isinstance(m, nn.LayerNorm) and m.eps != 1e-5:
            raise ValueError(f"cannot map layer norm with eps {m.eps} ({name}); ours uses 1e-5")
    return M


def from_timm(timm_swin: nn.Module) -> SwinTransformer:
    """Our Swin Transformer holding the weights of a timm `SwinTransformer` (swin_tiny_patch4_window7_224 and
    the others of the paper, or the same structure with other depths, heads, windows, patches, channels or
    classes). timm rolls a map before padding it to whole windows, ours (as the released detection code and
    torchvision) pads first: the two agree where every stage's map is a multiple of the window, as at the
    image size timm's model is built for (224 with M = 7).

    Args:
        timm_swin: a timm SwinTransformer with average pooling, one square window for every stage, none
            shrunk to a stage's map (a map smaller than the window), no absolute position embedding,
            attention dropout or head dropout; anything else is refused with a ValueError.
    """
    M = _check_timm(timm_swin)
    src = timm_swin.state_dict()
    stages = timm_swin.layers
    D, C, P, _ = src["patch_embed.proj.weight"].shape
    first = stages[0].blocks[0]
    model = SwinTransformer(
        in_chans=C, num_classes=timm_swin.head.fc.out_features, patch_size=P, embed_dim=D,
        depths=tuple(len(s.blocks) for s in stages), num_heads=tuple(s.blocks[0].attn.num_heads for s in stages),
        window_size=M, mlp_ratio=first.mlp.fc1.out_features / first.mlp.fc1.in_features,
        drop_path=getattr(stages[-1].blocks[-1].drop_path2, "drop_prob", 0.0), dropout=first.attn.proj_drop.p)
    ours_to_theirs = {f"patch_embed.norm.{p}": f"patch_embed.norm.{p}" for p in ("weight", "bias")}
    ours_to_theirs |= {"patch_embed.E.bias": "patch_embed.proj.bias", "head.weight": "head.fc.weight",
                       "head.bias": "head.fc.bias", "norm.weight": "norm.weight", "norm.bias": "norm.bias"}
    k = 0
    for i, stage in enumerate(stages):
        if i > 0:  # timm's stage begins with its patch merging, as our chain does
            ours_to_theirs |= {f"blocks.{k}.{name}": f"layers.{i}.downsample.{name}"
                               for name in ("norm.weight", "norm.bias", "reduction.weight")}
            k += 1
        for j in range(len(stage.blocks)):
            ours_to_theirs |= _block_names(f"blocks.{k}", f"layers.{i}.blocks.{j}")
            k += 1
    for ours in [o for o, t in ours_to_theirs.items() if "mlp." in t]:  # timm names the MLP's layers fc1, fc2
        ours_to_theirs[ours] = ours_to_theirs[ours].replace("mlp.0", "mlp.fc1").replace("mlp.3", "mlp.fc2")
    unmapped = sorted(set(src) - set(ours_to_theirs.values()) - {"patch_embed.proj.weight"})
    missing = sorted(t for t in ours_to_theirs.values() if t not in src)
    if unmapped or missing:
        raise ValueError(f"this timm Swin Transformer does not map onto the paper's: tensors of theirs not mapped "
                         f"{unmapped[:3]}, of ours not found {missing[:3]} (qkv without bias?)")
    state = {ours: src[theirs] for ours, theirs in ours_to_theirs.items()}
    state["patch_embed.E.weight"] = src["patch_embed.proj.weight"].permute(0, 2, 3, 1).reshape(D, P * P * C)
    with torch.no_grad():
        model.load_state_dict(state)  # strict: every tensor of ours is set
    return model


def readout(swin: SwinTransformer, x: torch.Tensor) -> torch.Tensor:
    """The pipeline's last stage: the LayerNorm, global average pooling, the head."""
    return swin.forward_head(swin.norm(x))


PAPER = PaperSpec(
    name="swin",
    family="transformer",
    title="Swin Transformer: Hierarchical Vision Transformer using Shifted Windows",
    authors="Liu, Lin, Cao, Hu, Wei, Zhang, Lin, Guo",
    year=2021,
    url="https://arxiv.org/abs/2103.14030",
    model=SwinTransformer,
    flavors=FLAVORS,
    inputs="image",
    task="classification",
    # the digits resized to 28x28, the size the tiny flavor is made for (Fashion-MNIST's); AdamW, warmup,
    # cosine and weight decay 0.05 as Section 4.1, at the repo's small batch
    defaults=dict(dataset="digits", image_size=28, epochs=20, batch_size=64, lr=1e-3, weight_decay=0.05,
                  warmup_steps=50, label_smoothing=0.1, clip_grad=5.0),
    reference="torchvision.models.swin_t/s/b (SwinTransformer with the V1 blocks)",
    data_kwargs=("num_classes", "in_chans"),
    shard_blocks="blocks",
    # Megatron-LM's split of each Swin block: the attention's heads (and the heads' columns of the relative
    # position bias tables) and the MLP's hidden units. No "norm": sequence parallelism would split the map's
    # rows, which the windows and the cyclic shift need whole
    tp_plan={"attn.W_qkv": "colwise-qkv", "attn.B_hat": "colwise", "attn.W_o": "rowwise", "mlp.fc1": "colwise",
             "mlp.fc2": "rowwise"},
    pipeline=PipelineChain(embed=lambda swin, images: swin.patch_embed(images), readout=readout,
                           first=("patch_embed",), last=("norm", "head")),
    pretrained={"torchvision": from_torchvision, "timm": from_timm},
    reference_models=(ReferenceModel("torchvision:swin_t", (8, 3, 56, 56), dict(num_classes=10)),
                      ReferenceModel("torchvision:swin_t", (2, 3, 224, 224))),
    # Section 4.1 (Regular ImageNet-1K training): AdamW for 300 epochs, cosine decay after 20 epochs of
    # linear warmup (20 x 1,251 steps of 1,024 images), batch 1024, lr 0.001, weight decay 0.05; DeiT's
    # augmentation and regularisation but repeated augmentation and EMA: of those, label smoothing 0.1,
    # the random-resized crop and flip here, and stochastic depth in the flavors (drop_path); RandAugment,
    # Mixup, CutMix and random erasing have no TrainConfig value. Gradient clipping at norm 5 is the
    # released code's configuration (TRAIN.CLIP_GRAD).
    recipe=dict(optimizer="adamw", lr=1e-3, weight_decay=0.05, batch_size=1024, epochs=300, schedule="cosine",
                warmup_steps=25020, label_smoothing=0.1, clip_grad=5.0, augment="rrc:0.08,flip"),
)
