"""FCN: Long, Shelhamer and Darrell, 2015. The spec, and weight loading from torchvision."""

import re

import torch.nn as nn

from common.pretrained import load_mapped
from papers import PaperSpec
from papers.fcn.model import FCN, FLAVORS, TORCHVISION_FLAVORS, ResNetFCN


def torchvision_name(ours: str) -> str:
    """Our tensor's name in torchvision's FCN: the backbone's ResNet names (papers/resnet's mapping),
    under `backbone.`; the heads keep theirs."""
    if not ours.startswith(("stem.", "stages.")):
        return ours  # classifier.*, aux_classifier.*
    name = ours.replace("stem.conv.", "conv1.").replace("stem.bn.", "bn1.")
    name = re.sub(r"^stages\.(\d+)\.", lambda m: f"layer{int(m[1]) + 1}.", name)
    name = name.replace("shortcut.conv.", "downsample.0.").replace("shortcut.bn.", "downsample.1.")
    return f"backbone.{name}"


def from_torchvision(tv_model: nn.Module) -> ResNetFCN:
    """Our `ResNetFCN` holding the weights of a torchvision FCN on a ResNet (fcn_resnet50 or
    fcn_resnet101, any num_classes, with or without aux_loss).

    Args:
        tv_model: a `torchvision.models.segmentation.FCN` whose backbone is a bottleneck ResNet with
            layer3 and layer4 dilated (torchvision's); another geometry is a ValueError.
    """
    from torchvision.models.segmentation.fcn import FCN as TorchvisionFCN

    if not isinstance(tv_model, TorchvisionFCN) or not hasattr(tv_model.backbone, "layer4"):
        raise ValueError(f"expected a torchvision FCN on a ResNet, got {type(tv_model).__name__}")
    backbone = tv_model.backbone
    model = ResNetFCN(layers=tuple(len(getattr(backbone, f"layer{i}")) for i in range(1, 5)),
                      aux_loss=tv_model.aux_classifier is not None,
                      num_classes=tv_model.classifier[-1].out_channels, in_chans=backbone.conv1.in_channels)
    for name, m in model.named_modules():  # the names map the tensors; here the geometry must agree too
        if isinstance(m, (nn.Conv2d, nn.BatchNorm2d)):
            theirs = tv_model.get_submodule(torchvision_name(f"{name}.weight").rsplit(".", 1)[0])
            keys = ("stride", "padding", "dilation", "groups") if isinstance(m, nn.Conv2d) else ("eps",)
            if any(getattr(m, k) != getattr(theirs, k, None) for k in keys):
                raise ValueError(f"cannot map {name} ({theirs}); ours is {m}")
    ours_to_theirs = {k: torchvision_name(k) for k in model.state_dict()}
    return load_mapped(model, tv_model, ours_to_theirs, "torchvision FCN")


PAPER = PaperSpec(
    name="fcn",
    family="cnn",
    title="Fully Convolutional Networks for Semantic Segmentation",
    authors="Long, Shelhamer, Darrell",
    year=2015,
    url="https://arxiv.org/abs/1411.4038",
    model=FCN,
    flavors={**FLAVORS, **TORCHVISION_FLAVORS},
    inputs="image",
    task="segmentation",
    data_kwargs=("num_classes", "in_chans"),
    padded_batches=True,
    defaults=dict(dataset="fashion-canvas", epochs=4, batch_size=16, lr=1e-3, weight_decay=5e-4, warmup_steps=50,
                  bucketing="size", clip_grad=1.0),
    reference="shelhamer/fcn.berkeleyvision.org's voc-fcn32s/16s/8s (crops, initialisation, parameter counts of Table "
              "1); torchvision.models.segmentation.fcn_resnet50 (from_torchvision)",
    shard_blocks="blocks",
    # torchvision's fcn_resnet50 is another model (a dilated ResNet and a convolutional head)
    variants={name: dict(model=ResNetFCN, shard_blocks="stages") for name in TORCHVISION_FLAVORS},
)
