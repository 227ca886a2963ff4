"""DenseNet: Huang et al., 2016. The spec, and weight loading from torchvision."""

import torch.nn as nn

from common.pretrained import load_mapped
from papers import PaperSpec, ReferenceModel
from papers.densenet.model import FLAVORS, DenseNet

NORM = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def from_torchvision(tv_model: nn.Module) -> DenseNet:
    """Our DenseNet holding the weights of a torchvision `DenseNet` (densenet121/169/201/161, or the
    same structure with other growth rates, block lengths, stems or classes; memory_efficient either
    way, since it changes only what is kept for the backward pass).

    torchvision's `drop_rate` is carried over as our `dropout`, which also acts after the bottleneck
    and transition convolutions (Section 4.2) where torchvision's acts after the 3x3 convolution
    only; eval-mode outputs are the same.

    Args:
        tv_model: a `torchvision.models.DenseNet`; one whose layers were replaced (another stem,
            norm, pooling, convolution shape or classifier) is refused with a ValueError.
    """
    from torchvision.models.densenet import DenseNet as TorchvisionDenseNet
    from torchvision.models.densenet import _DenseBlock, _Transition

    if not isinstance(tv_model, TorchvisionDenseNet):
        raise ValueError(f"expected a torchvision DenseNet, got {type(tv_model).__name__}")
    features = tv_model.features
    expected = ["conv0", "norm0", "relu0", "pool0"]
    names = [name for name, _ in features.named_children()]
    blocks = [m for m in features.children() if isinstance(m, _DenseBlock)]
    transitions = [m for m in features.children() if isinstance(m, _Transition)]
    layout = expected + [n for i in range(len(blocks)) for n in (f"denseblock{i + 1}", f"transition{i + 1}")]
    layout = layout[:-1] + ["norm5"]  # no transition after the last block
    if names != layout:
        raise ValueError(f"cannot map a torchvision DenseNet laid out as {names}; expected {layout}")
    conv0, pool0 = features.conv0, features.pool0
    if ((conv0.kernel_size, conv0.stride, conv0.padding) != ((7, 7), (2, 2), (3, 3))
            or not isinstance(pool0, nn.MaxPool2d)
            or (pool0.kernel_size, pool0.stride, pool0.padding) not in ((3, 2, 1), ((3, 3), (2, 2), (1, 1)))):
        raise ValueError("cannot map a torchvision DenseNet whose stem is not the 7x7/2 convolution and 3x3/2 max pool")
    for t, transition in enumerate(transitions):
        pool = transition.pool
        if not isinstance(pool, nn.AvgPool2d) or pool.kernel_size not in (2, (2, 2)) or pool.stride not in (2, (2, 2)):
            raise ValueError(f"cannot map transition{t + 1}'s {pool}; the paper's transitions pool 2x2 with stride 2")
    for name, m in tv_model.named_modules():
        if isinstance(m, nn.BatchNorm2d) and (m.eps != 1e-5 or not m.affine or not m.track_running_stats):
            raise ValueError(f"cannot map batch norm {name} (eps {m.eps}, affine {m.affine}); ours is "
                             "nn.BatchNorm2d's default")
        if isinstance(m, nn.Conv2d) and (m.groups != 1 or m.dilation != (1, 1) or m.bias is not None):
            raise ValueError(f"cannot map convolution {name}: grouped, dilated or with a bias; the paper's have none")
    if not isinstance(tv_model.classifier, nn.Linear):
        raise ValueError(f"cannot map the classifier {type(tv_model.classifier).__name__}; ours is one nn.Linear")

    first = blocks[0].denselayer1
    growth_rate = first.conv2.out_channels
    model = DenseNet(
        growth_rate=growth_rate,
        block_config=tuple(len(block) for block in blocks),
        stem="imagenet",
        stem_chans=conv0.out_channels,
        bottleneck=first.conv1.out_channels // growth_rate,
        compression=0.5,  # torchvision's transitions keep num_features // 2
        dropout=first.drop_rate,
        num_classes=tv_model.classifier.out_features,
        in_chans=conv0.in_channels,
    )

    ours_to_theirs = {"stem.conv.weight": "features.conv0.weight", "fc.weight": "classifier.weight",
                      "fc.bias": "classifier.bias"}
    ours_to_theirs |= {f"stem.norm.{p}": f"features.norm0.{p}" for p in NORM}
    ours_to_theirs |= {f"norm.{p}": f"features.norm5.{p}" for p in NORM}
    for i, n in enumerate(len(block) for block in blocks):
        for j in range(n):
            ours, theirs = f"dense_blocks.{i}.layers.{j}", f"features.denseblock{i + 1}.denselayer{j + 1}"
            ours_to_theirs |= {f"{ours}.{c}.weight": f"{theirs}.{c}.weight" for c in ("conv1", "conv2")}
            ours_to_theirs |= {f"{ours}.{bn}.{p}": f"{theirs}.{bn}.{p}" for bn in ("norm1", "norm2") for p in NORM}
        if i < len(transitions):
            ours_to_theirs[f"transitions.{i}.conv.weight"] = f"features.transition{i + 1}.conv.weight"
            ours_to_theirs |= {f"transitions.{i}.norm.{p}": f"features.transition{i + 1}.norm.{p}" for p in NORM}

    return load_mapped(model, tv_model, ours_to_theirs, "torchvision DenseNet")


PAPER = PaperSpec(
    name="densenet",
    family="cnn",
    title="Densely Connected Convolutional Networks",
    authors="Huang, Liu, van der Maaten, Weinberger",
    year=2016,
    url="https://arxiv.org/abs/1608.06993",
    model=DenseNet,
    flavors=FLAVORS,
    inputs="image",
    task="classification",
    data_kwargs=("num_classes", "in_chans"),
    defaults=dict(dataset="digits", image_size=32, epochs=20, batch_size=64, lr=3e-3, weight_decay=0.05,
                  warmup_steps=50, label_smoothing=0.1, clip_grad=1.0),
    reference="torchvision.models.densenet121/169/201 (memory_efficient=False)",
    shard_blocks="dense_blocks",
    padded_batches=True,
    pretrained={"torchvision": from_torchvision},
    reference_models=(ReferenceModel("torchvision:densenet121", (8, 3, 64, 64)),),
    # Section 4.2, CIFAR: SGD with Nesterov momentum 0.9 without dampening, weight decay 1e-4, batch 64,
    # 300 epochs, lr 0.1 divided by 10 at 50% and 75% of the epochs; C10+/C100+ use the standard
    # augmentation (4-pixel padding and random crops, horizontal flips), and then no dropout: the
    # paper's dropout of 0.2 is for the data sets without augmentation, and it belongs to the model
    # (the flavors' `dropout`, 0 by default), not to this recipe. The trainer decays only weight
    # matrices (common.optim.param_groups), where the authors' Torch code decays every parameter.
    recipe=dict(optimizer="sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4, batch_size=64,
                epochs=300, schedule="step", milestones="0.5,0.75", gamma=0.1, augment="crop:4,flip",
                label_smoothing=0.0, clip_grad=0.0, warmup_steps=0),
)
