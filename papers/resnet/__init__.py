"""ResNet: He et al., 2015. The spec, and weight loading from torchvision."""

import torch.nn as nn

from common.pretrained import load_mapped
from papers import PaperSpec, PipelineChain, ReferenceModel
from papers.resnet.model import FLAVORS, Projection, ResNet


def from_torchvision(tv_model: nn.Module) -> ResNet:
    """Our ResNet holding the weights of a torchvision `ResNet` (resnet18/34/50/101/152, our flavors
    torchvision-resnet18 ... torchvision-resnet152, or the same structure with other depths, classes
    or input channels): option B shortcuts, and bottlenecks that stride their 3x3 convolution.

    Args:
        tv_model: a `torchvision.models.ResNet` with plain BasicBlocks or Bottlenecks; grouped
            (ResNeXt), wide or dilated variants, or a changed stem, are refused with a ValueError.
    """
    from torchvision.models.resnet import BasicBlock, Bottleneck
    from torchvision.models.resnet import ResNet as TorchvisionResNet

    if not isinstance(tv_model, TorchvisionResNet):
        raise ValueError(f"expected a torchvision ResNet, got {type(tv_model).__name__}")
    stages = [tv_model.layer1, tv_model.layer2, tv_model.layer3, tv_model.layer4]
    kinds = {type(b) for stage in stages for b in stage}
    if kinds == {BasicBlock}:
        block = "basic"
    elif kinds == {Bottleneck}:
        block = "bottleneck"
    else:
        raise ValueError(f"cannot map a torchvision ResNet built of {sorted(k.__name__ for k in kinds)}; "
                         "only BasicBlock or Bottleneck throughout")
    stem, pool = tv_model.conv1, tv_model.maxpool
    if ((stem.kernel_size, stem.stride, stem.padding) != ((7, 7), (2, 2), (3, 3)) or not isinstance(pool, nn.MaxPool2d)
            or (pool.kernel_size, pool.stride, pool.padding) not in ((3, 2, 1), ((3, 3), (2, 2), (1, 1)))):
        raise ValueError("cannot map a torchvision ResNet whose stem is not the 7x7/2 convolution and 3x3/2 max pool")
    for name, m in tv_model.named_modules():
        if isinstance(m, nn.Conv2d) and (m.groups != 1 or m.dilation != (1, 1)):
            raise ValueError(f"cannot map grouped or dilated convolutions ({name}); the paper's ResNet has neither")
        if isinstance(m, nn.BatchNorm2d) and m.eps != 1e-5:
            raise ValueError(f"cannot map batch norm with eps {m.eps} ({name}); ours uses 1e-5")
        if isinstance(m, (nn.GroupNorm, nn.LayerNorm)):
            raise ValueError(f"cannot map {type(m).__name__} ({name}); the paper's ResNet uses batch norm")

    first_conv = "conv1" if block == "basic" else "conv2"  # its filters are the stage's width
    model = ResNet(
        block=block,
        layers=tuple(len(stage) for stage in stages),
        widths=tuple(getattr(stage[0], first_conv).out_channels for stage in stages),
        stem="imagenet",
        shortcut="B",
        stride_on="3x3",  # torchvision's Bottleneck strides conv2
        num_classes=tv_model.fc.out_features,
        in_chans=stem.in_channels,
    )

    norm = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    ours_to_theirs = {"stem.conv.weight": "conv1.weight", "fc.weight": "fc.weight", "fc.bias": "fc.bias"}
    ours_to_theirs |= {f"stem.bn.{p}": f"bn1.{p}" for p in norm}
    convs = ("conv1", "conv2") if block == "basic" else ("conv1", "conv2", "conv3")
    for i, stage in enumerate(stages):
        for j in range(len(stage)):
            ours, theirs = f"stages.{i}.{j}", f"layer{i + 1}.{j}"
            for c in convs:
                bn = c.replace("conv", "bn")
                ours_to_theirs[f"{ours}.{c}.weight"] = f"{theirs}.{c}.weight"
                ours_to_theirs |= {f"{ours}.{bn}.{p}": f"{theirs}.{bn}.{p}" for p in norm}
            if isinstance(model.stages[i][j].shortcut, Projection):  # where torchvision has a downsample
                ours_to_theirs[f"{ours}.shortcut.conv.weight"] = f"{theirs}.downsample.0.weight"
                ours_to_theirs |= {f"{ours}.shortcut.bn.{p}": f"{theirs}.downsample.1.{p}" for p in norm}

    return load_mapped(model, tv_model, ours_to_theirs, "torchvision ResNet")


PAPER = PaperSpec(
    name="resnet",
    family="cnn",
    title="Deep Residual Learning for Image Recognition",
    authors="He, Zhang, Ren, Sun",
    year=2015,
    url="https://arxiv.org/abs/1512.03385",
    model=ResNet,
    flavors=FLAVORS,
    inputs="image",
    task="classification",
    data_kwargs=("num_classes", "in_chans"),
    defaults=dict(dataset="digits", epochs=15, batch_size=64, lr=3e-3, weight_decay=0.05, warmup_steps=20,
                  label_smoothing=0.1, clip_grad=1.0),
    reference="torchvision.models.resnet18/34/50/101/152 (the torchvision-resnet* flavors)",
    shard_blocks="stages",
    # the stem, then the stages of residual blocks (each a stage of the pipeline's chain), then pooling and fc
    pipeline=PipelineChain(embed=lambda resnet, images: resnet.stem(images)[0],
                           readout=lambda resnet, x: resnet.forward_head(x), first=("stem",), last=("fc",)),
    padded_batches=True,
    pretrained={"torchvision": from_torchvision},
    reference_models=(ReferenceModel("torchvision:resnet18", (16, 3, 64, 64)), ReferenceModel("torchvision:resnet50", (8, 3, 64, 64))),
    # Section 4.2, CIFAR-10: SGD, momentum 0.9, weight decay 1e-4, mini-batch 128, lr 0.1 divided by 10
    # at 32k and 48k iterations and stopped at 64k; 4 pixels padded on each side, a random 32x32 crop
    # or its horizontal flip. No warmup: lr 0.01 until the training error is below 80% (about 400
    # iterations) is ResNet-110's alone (--warmup-steps 400 comes closest, a linear ramp to 0.1).
    # 200 epochs, so that the 64k steps end the run (CIFAR-10 makes 390 steps of 128 an epoch: 165 epochs).
    recipe=dict(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-4, batch_size=128, epochs=200,
                max_steps=64000, schedule="step", milestones="0.5,0.75", gamma=0.1, augment="crop:4,flip",
                label_smoothing=0.0, clip_grad=0.0, warmup_steps=0),
)
