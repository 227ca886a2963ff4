"""ConvNeXt: Liu et al., 2022. The spec, and weight loading from torchvision and timm."""

import torch
import torch.nn as nn

from papers import PaperSpec, PipelineChain, ReferenceModel
from papers.convnext.model import FLAVORS, ConvNeXt

PARAMS = ("weight", "bias")


def _block_names(ours: str, theirs: dict[str, str]) -> dict[str, str]:
    """Our block's tensors -> the reference's: `theirs` names the reference's layers as ours (dwconv, norm,
    pwconv1, pwconv2, gamma)."""
    names = {f"{ours}.gamma": theirs["gamma"]}
    for layer in ("dwconv", "norm", "pwconv1", "pwconv2"):
        names |= {f"{ours}.{layer}.{p}": f"{theirs[layer]}.{p}" for p in PARAMS}
    return names


def _load(model: ConvNeXt, reference: nn.Module, ours_to_theirs: dict[str, str], what: str) -> ConvNeXt:
    """model with the reference's tensors copied in by name, strictly (every tensor of either side mapped, of the
    same number of elements; torchvision's layer scale is (C, 1, 1) where ours is (C,)), else a ValueError."""
    src, dst = reference.state_dict(), model.state_dict()
    missing = sorted(set(src) - set(ours_to_theirs.values()))
    unmatched = sorted(k for k in dst if ours_to_theirs.get(k) not in src)
    wrong = sorted(k for k in dst if k not in unmatched and dst[k].numel() != src[ours_to_theirs[k]].numel())
    if missing or unmatched or wrong:
        raise ValueError(f"this {what} does not map onto the paper's ConvNeXt: tensors of theirs not mapped "
                         f"{missing[:3]}, of ours not found {unmatched[:3]}, of another size {wrong[:3]}")
    with torch.no_grad():
        model.load_state_dict({k: src[ours_to_theirs[k]].reshape(dst[k].shape) for k in dst})  # strict
    return model


def _check_layers(reference: nn.Module, what: str) -> None:
    """Refuse what the paper's ConvNeXt has not: norms other than LN with eps 1e-6, activations other than
    the exact GELU, dilated or biasless convolutions."""
    for name, m in reference.named_modules():
        if isinstance(m, nn.LayerNorm) and (m.eps != 1e-6 or not m.elementwise_affine):
            raise ValueError(f"cannot map {name}: LayerNorm with eps {m.eps}; the paper's ConvNeXt uses 1e-6")
        if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            raise ValueError(f"cannot map {name}: {type(m).__name__}; the paper's ConvNeXt uses LN")
        if isinstance(m, nn.GELU) and m.approximate != "none":
            raise ValueError(f"cannot map {name}: GELU approximated by {m.approximate}; ours is exact")
        if isinstance(m, nn.Conv2d) and (m.dilation != (1, 1) or m.bias is None):
            raise ValueError(f"cannot map {name}: a dilated or biasless convolution; the paper's has neither")
        if type(m).__name__ in ("GlobalResponseNorm", "GlobalResponseNormMlp", "ConvMlp") or \
                (name.endswith(".act") and type(m).__name__ != "GELU"):
            raise ValueError(f"cannot map {name}: {type(m).__name__}, which the paper's ConvNeXt block has not")


def from_torchvision(tv_model: nn.Module) -> ConvNeXt:
    """Our ConvNeXt holding the weights of a torchvision `ConvNeXt` (convnext_tiny/small/base/large, or the
    constructor's other block settings: depths, widths, number of stages, classes).

    Args:
        tv_model: a `torchvision.models.ConvNeXt` of CNBlocks and LayerNorm2d (eps 1e-6); another block or
            norm layer, or a block setting whose stages do not chain, is refused with a ValueError.
    """
    from torchvision.models.convnext import CNBlock
    from torchvision.models.convnext import ConvNeXt as TorchvisionConvNeXt

    if not isinstance(tv_model, TorchvisionConvNeXt):
        raise ValueError(f"expected a torchvision ConvNeXt, got {type(tv_model).__name__}")
    _check_layers(tv_model, "torchvision ConvNeXt")
    features = list(tv_model.features)
    stages = features[1::2]  # the stem, then each stage's blocks and, between them, a downsampling layer
    if not all(isinstance(b, CNBlock) for stage in stages for b in stage):
        raise ValueError("cannot map a torchvision ConvNeXt whose blocks are not CNBlocks")
    depths, dims = tuple(len(s) for s in stages), tuple(s[0].block[0].in_channels for s in stages)
    ours_to_theirs = {f"stem.conv.{p}": f"features.0.0.{p}" for p in PARAMS}
    ours_to_theirs |= {f"stem.norm.{p}": f"features.0.1.{p}" for p in PARAMS}
    ours_to_theirs |= {f"norm.{p}": f"classifier.0.{p}" for p in PARAMS} | {f"head.{p}": f"classifier.2.{p}" for p in PARAMS}
    for i, depth in enumerate(depths):
        if i:
            ours_to_theirs |= {f"stages.{i}.downsample.{k}.{p}": f"features.{2 * i}.{k}.{p}" for k in (0, 1) for p in PARAMS}
        for j in range(depth):
            theirs = f"features.{2 * i + 1}.{j}"
            ours_to_theirs |= _block_names(f"stages.{i}.blocks.{j}", dict(
                gamma=f"{theirs}.layer_scale", dwconv=f"{theirs}.block.0", norm=f"{theirs}.block.2",
                pwconv1=f"{theirs}.block.3", pwconv2=f"{theirs}.block.5"))
    model = ConvNeXt(depths=depths, dims=dims, num_classes=tv_model.classifier[2].out_features,
                     drop_path_rate=stages[-1][-1].stochastic_depth.p)  # the last block's is the rate
    return _load(model, tv_model, ours_to_theirs, "torchvision ConvNeXt")


def from_timm(timm_model: nn.Module) -> ConvNeXt:
    """Our ConvNeXt holding the weights of a timm `ConvNeXt` (convnext_tiny ... convnext_xlarge, or the
    constructor's other depths, dims, patch size, kernel size, channels and classes; layer scale or none).

    Args:
        timm_model: a timm ConvNeXt with the paper's patchify stem, linear layers (conv_mlp False), one kernel
            size throughout, average pooling and the norm after it; ConvNeXt V2's GRN, a head MLP, a
            dilated output stride or another stem is refused with a ValueError.
    """
    from timm.models.convnext import ConvNeXt as TimmConvNeXt

    if not isinstance(timm_model, TimmConvNeXt):
        raise ValueError(f"expected a timm ConvNeXt, got {type(timm_model).__name__}")
    _check_layers(timm_model, "timm ConvNeXt")
    head, stem = timm_model.head, timm_model.stem
    if not isinstance(getattr(head, "pre_logits", None), nn.Identity) or not isinstance(timm_model.norm_pre, nn.Identity) \
            or getattr(head.global_pool, "pool_type", "avg") != "avg":
        raise ValueError("cannot map a timm ConvNeXt with a head MLP, the norm before the pooling or other pooling")
    if len(stem) != 2 or stem[0].kernel_size != stem[0].stride:
        raise ValueError("cannot map a timm ConvNeXt whose stem is not the patchify convolution and a norm")
    if not isinstance(timm_model.stages[0].downsample, nn.Identity):
        raise ValueError("cannot map a timm ConvNeXt that downsamples before its first stage (a stem of stride 2); "
                         "the paper's first stage reads the stem's output")
    kernels = {b.conv_dw.kernel_size for s in timm_model.stages for b in s.blocks}
    if len(kernels) != 1:
        raise ValueError(f"cannot map a timm ConvNeXt with several kernel sizes {sorted(kernels)}; ours has one")
    ours_to_theirs = {f"stem.conv.{p}": f"stem.0.{p}" for p in PARAMS} | {f"stem.norm.{p}": f"stem.1.{p}" for p in PARAMS}
    ours_to_theirs |= {f"norm.{p}": f"head.norm.{p}" for p in PARAMS} | {f"head.{p}": f"head.fc.{p}" for p in PARAMS}
    for i, stage in enumerate(timm_model.stages):
        if i:
            ours_to_theirs |= {f"stages.{i}.downsample.{k}.{p}": f"stages.{i}.downsample.{k}.{p}" for k in (0, 1) for p in PARAMS}
        for j in range(len(stage.blocks)):
            theirs = f"stages.{i}.blocks.{j}"
            ours_to_theirs |= _block_names(f"stages.{i}.blocks.{j}", dict(
                gamma=f"{theirs}.gamma", dwconv=f"{theirs}.conv_dw", norm=f"{theirs}.norm",
                pwconv1=f"{theirs}.mlp.fc1", pwconv2=f"{theirs}.mlp.fc2"))
    scaled = timm_model.stages[0].blocks[0].gamma is not None
    if not scaled:  # ls_init_value=None: no layer scale
        ours_to_theirs = {k: v for k, v in ours_to_theirs.items() if not k.endswith(".gamma")}
    model = ConvNeXt(depths=tuple(len(s.blocks) for s in timm_model.stages),
                     dims=tuple(s.blocks[0].conv_dw.in_channels for s in timm_model.stages),
                     patch_size=stem[0].kernel_size[0], kernel_size=kernels.pop()[0],
                     layer_scale_init=1e-6 if scaled else 0.0, num_classes=head.fc.out_features,
                     in_chans=stem[0].in_channels)
    return _load(model, timm_model, ours_to_theirs, "timm ConvNeXt")


PAPER = PaperSpec(
    name="convnext",
    family="cnn",
    title="A ConvNet for the 2020s",
    authors="Liu, Mao, Wu, Feichtenhofer, Darrell, Xie",
    year=2022,
    url="https://arxiv.org/abs/2201.03545",
    model=ConvNeXt,
    flavors=FLAVORS,
    inputs="image",
    task="classification",
    data_kwargs=("num_classes", "in_chans"),
    # the digits at 28 x 28, the size the tiny flavor is built for (Fashion-MNIST's)
    defaults=dict(dataset="digits", image_size=28, epochs=15, batch_size=64, lr=2e-3, weight_decay=0.05,
                  warmup_steps=20, label_smoothing=0.1, clip_grad=1.0),
    reference="torchvision.models.convnext_tiny/small/base/large and timm's ConvNeXt (convnext_tiny, ...)",
    shard_blocks="stages",
    # the stem, then the stages (each its downsampling layer and its blocks), then pooling, LN and the head
    pipeline=PipelineChain(embed=lambda convnext, images: convnext.stem(images),
                           readout=lambda convnext, x: convnext.forward_head(x), first=("stem",),
                           last=("norm", "head")),
    pretrained={"torchvision": from_torchvision, "timm": from_timm},
    reference_models=(ReferenceModel("torchvision:convnext_tiny", (8, 3, 64, 64)),
                      ReferenceModel("timm:convnext_tiny", (8, 3, 64, 64))),
    # Appendix A.1, Table 5, ImageNet-1K training of ConvNeXt-T/S/B/L: AdamW, lr 4e-3 at batch 4096, weight
    # decay 0.05, momentum (0.9, 0.999), 300 epochs, 20 warmup epochs then cosine decay, label smoothing 0.1.
    # 20 epochs of ImageNet-1K (1,281,167 images) at 4096 are 6,255 steps. Not expressible here: Mixup 0.8,
    # CutMix 1.0, RandAugment (9, 0.5), Random Erasing 0.25, EMA of the weights (0.9999); the stochastic depth
    # rates (0.1/0.4/0.5/0.5) and layer scale (1e-6) belong to the model (its flavors). The crops are
    # random-resized, 8% to 100% of the area, with flips (timm's default training transform, which the
    # official code uses). No gradient clipping.
    recipe=dict(optimizer="adamw", lr=4e-3, weight_decay=0.05, batch_size=4096, epochs=300, warmup_steps=6255,
                schedule="cosine", label_smoothing=0.1, augment="rrc:0.08,flip", clip_grad=0.0),
)
