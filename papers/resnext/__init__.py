"""ResNeXt: Xie et al., 2017. The spec, and weight loading from torchvision."""

import re

import torch.nn as nn

from common.pretrained import load_mapped
from papers import PaperSpec, PipelineChain, ReferenceModel
from papers.resnext.model import FLAVORS, ResNeXt


def check_torchvision(tv_model: nn.Module) -> int:
    """The cardinality of a torchvision ResNet that maps onto ours; a ValueError naming what does not."""
    from torchvision.models.resnet import Bottleneck
    from torchvision.models.resnet import ResNet as TorchvisionResNet

    if not isinstance(tv_model, TorchvisionResNet):
        raise ValueError(f"cannot map {type(tv_model).__name__}: expected a torchvision ResNet")
    blocks = [b for stage in (tv_model.layer1, tv_model.layer2, tv_model.layer3, tv_model.layer4) for b in stage]
    kinds = sorted({type(b).__name__ for b in blocks})
    if kinds != ["Bottleneck"] or not all(isinstance(b, Bottleneck) for b in blocks):
        raise ValueError(f"cannot map a torchvision ResNet built of {kinds}; ResNeXt's blocks are Bottlenecks")
    stem, pool = tv_model.conv1, tv_model.maxpool
    if ((stem.kernel_size, stem.stride, stem.padding) != ((7, 7), (2, 2), (3, 3)) or not isinstance(pool, nn.MaxPool2d)
            or (pool.kernel_size, pool.stride, pool.padding) not in ((3, 2, 1), ((3, 3), (2, 2), (1, 1)))):
        raise ValueError("cannot map a torchvision ResNet whose stem is not the 7x7/2 convolution and 3x3/2 max pool")
    groups = {b.conv2.groups for b in blocks}
    if len(groups) != 1:
        raise ValueError(f"cannot map a torchvision ResNet with cardinalities {sorted(groups)}; ours has one")
    for name, m in tv_model.named_modules():
        if isinstance(m, nn.Conv2d) and m.dilation != (1, 1):
            raise ValueError(f"cannot map dilated convolutions ({name}); the paper's ResNeXt has none")
        if isinstance(m, nn.Conv2d) and m.groups != 1 and not name.endswith("conv2"):
            raise ValueError(f"cannot map a grouped convolution outside the 3x3s ({name})")
        if isinstance(m, (nn.GroupNorm, nn.LayerNorm)) or (isinstance(m, nn.BatchNorm2d) and m.eps != 1e-5):
            raise ValueError(f"cannot map {type(m).__name__} ({name}); ours is batch norm with eps 1e-5")
    return groups.pop()


def torchvision_name(ours: str) -> str:
    """Our parameter's name in torchvision's ResNet: stem.conv -> conv1, stages.0.2.bn3 -> layer1.2.bn3,
    stages.1.0.shortcut.conv -> layer2.0.downsample.0."""
    theirs = re.sub(r"^stem\.conv\.", "conv1.", re.sub(r"^stem\.bn\.", "bn1.", ours))
    theirs = re.sub(r"^stages\.(\d+)\.", lambda m: f"layer{int(m.group(1)) + 1}.", theirs)
    return theirs.replace(".shortcut.conv.", ".downsample.0.").replace(".shortcut.bn.", ".downsample.1.")


def from_torchvision(tv_model: nn.Module) -> ResNeXt:
    """Our ResNeXt holding the weights of a torchvision ResNet of Bottlenecks: resnext50_32x4d,
    resnext101_32x8d, resnext101_64x4d, or `ResNet(Bottleneck, layers, groups=C, width_per_group=d,
    num_classes=K)` with any depths, C, d and K (groups=1 is ResNet's bottleneck, the paper's 1x64d; a
    wide ResNet is 1x128d). Both stride the 3x3 and project with option B; every tensor, batch-norm
    statistics included, is mapped strictly.

    Args:
        tv_model: a `torchvision.models.ResNet`; BasicBlocks, dilated convolutions, another stem or
            other normalisations are refused with a ValueError.
    """
    cardinality = check_torchvision(tv_model)
    stages = [tv_model.layer1, tv_model.layer2, tv_model.layer3, tv_model.layer4]
    widths = tuple(stage[0].conv3.out_channels // 4 for stage in stages)
    d = stages[0][0].conv2.out_channels // cardinality  # torchvision: width_per_group x widths[0] / 64
    model = ResNeXt(layers=tuple(len(stage) for stage in stages), widths=widths, cardinality=cardinality,
                    bottleneck_width=d, stem="imagenet", num_classes=tv_model.fc.out_features,
                    in_chans=tv_model.conv1.in_channels)
    ours_to_theirs = {name: torchvision_name(name) for name in model.state_dict()}
    return load_mapped(model, tv_model, ours_to_theirs, "torchvision ResNet")


PAPER = PaperSpec(
    name="resnext",
    family="cnn",
    title="Aggregated Residual Transformations for Deep Neural Networks",
    authors="Xie, Girshick, Dollár, Tu, He",
    year=2017,
    url="https://arxiv.org/abs/1611.05431",
    model=ResNeXt,
    flavors=FLAVORS,
    inputs="image",
    task="classification",
    data_kwargs=("num_classes", "in_chans"),
    defaults=dict(dataset="digits", epochs=15, batch_size=64, lr=3e-3, weight_decay=0.05, warmup_steps=20,
                  label_smoothing=0.1, clip_grad=1.0),
    reference="torchvision.models.resnext50_32x4d (and any torchvision ResNet of Bottlenecks, via from_torchvision)",
    shard_blocks="stages",
    # the stem, then the stages of aggregated bottlenecks (each a stage of the pipeline's chain), then pooling and fc
    pipeline=PipelineChain(embed=lambda model, images: model.stem(images)[0],
                           readout=lambda model, x: model.forward_head(x), first=("stem",), last=("fc",)),
    padded_batches=True,
    pretrained={"torchvision": from_torchvision},
    reference_models=(ReferenceModel("torchvision:resnext50_32x4d", (8, 3, 64, 64)),),
    # Section 4, ImageNet: SGD with mini-batch 256, weight decay 1e-4, momentum 0.9, lr 0.1 divided by 10
    # three times "using the schedule in [11]" (fb.resnet.torch: every 30 epochs; the paper's code trains
    # ImageNet for 100 epochs, so at 30, 60 and 90, and uses Nesterov momentum); 224x224 crops with "the scale
    # and aspect ratio augmentation of [38]" (rrc:0.08) and flips; fb.resnet.torch also adds AlexNet's PCA
    # lighting noise (0.1) and a colour jitter the trainer does not have.
    recipe=dict(optimizer="sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4, batch_size=256,
                epochs=100, schedule="step", milestones="0.3,0.6,0.9", gamma=0.1,
                augment="rrc:0.08,flip,lighting:0.1", label_smoothing=0.0, clip_grad=0.0, warmup_steps=0),
)
