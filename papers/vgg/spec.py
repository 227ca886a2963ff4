"""VGG: Simonyan and Zisserman, 2014. The spec, and weight loading from torchvision."""

import torch
import torch.nn as nn

from papers import PaperSpec, PipelineChain, ReferenceModel
from papers.vgg.model import FLAVORS, VGG


def from_torchvision(tv_model: nn.Module) -> VGG:
    """Our VGG holding the weights of a torchvision `VGG` (vgg11/13/16/19 and their _bn, or the
    same structure with other classes or input channels): a torchvision-* flavor, with
    torchvision's AdaptiveAvgPool2d((7, 7)) before the head.

    Args:
        tv_model: a `torchvision.models.VGG` whose features are 3x3 convolutions (padding 1), each
            optionally followed by batch norm, ReLUs and 2x2/2 max poolings, and whose classifier is
            Linear, ReLU, Dropout, Linear, ReLU, Dropout, Linear. Anything else is a ValueError.
    """
    from torchvision.models.vgg import VGG as TorchvisionVGG

    if not isinstance(tv_model, TorchvisionVGG):
        raise ValueError(f"expected a torchvision VGG, got {type(tv_model).__name__}")
    blocks, block, batch_norm = [], [], set()
    for i, m in enumerate(tv_model.features):
        if isinstance(m, nn.Conv2d):
            if (m.kernel_size, m.stride, m.padding, m.dilation, m.groups) != ((3, 3), (1, 1), (1, 1), (1, 1), 1) \
                    or m.bias is None:
                raise ValueError(f"cannot map features.{i} ({m}); the paper's convolutions are 3x3, stride 1, "
                                 f"padding 1, with a bias")
            block.append(f"conv3-{m.out_channels}")
            batch_norm.add(isinstance(tv_model.features[i + 1], nn.BatchNorm2d))
        elif isinstance(m, nn.MaxPool2d):
            if (m.kernel_size, m.stride, m.padding, m.ceil_mode) not in ((2, 2, 0, False), ((2, 2), (2, 2), 0, False)):
                raise ValueError(f"cannot map features.{i} ({m}); the paper's max pooling is 2x2 with stride 2")
            blocks.append(tuple(block))
            block = []
        elif isinstance(m, nn.BatchNorm2d):
            if m.eps != 1e-5 or not m.affine or not m.track_running_stats:
                raise ValueError(f"cannot map features.{i} ({m}); ours is nn.BatchNorm2d's default")
        elif not isinstance(m, nn.ReLU):
            raise ValueError(f"cannot map features.{i} ({type(m).__name__}); VGG has convolutions, batch norm, "
                             "ReLUs and max poolings")
    if block or not blocks:
        raise ValueError("cannot map a torchvision VGG whose features do not end with a max pooling")
    if len(batch_norm) != 1:
        raise ValueError("cannot map a torchvision VGG with batch norm after some convolutions only")
    pool, head = tv_model.avgpool, tv_model.classifier
    kinds = [type(m) for m in head]
    if not isinstance(pool, nn.AdaptiveAvgPool2d) or pool.output_size not in (7, (7, 7)) or kinds != [
            nn.Linear, nn.ReLU, nn.Dropout, nn.Linear, nn.ReLU, nn.Dropout, nn.Linear]:
        raise ValueError("cannot map a torchvision VGG whose head is not AdaptiveAvgPool2d((7, 7)) and "
                         "Linear, ReLU, Dropout, Linear, ReLU, Dropout, Linear")
    if head[2].p != head[5].p:
        raise ValueError(f"cannot map two different dropout ratios ({head[2].p}, {head[5].p}); ours share one")

    with torch.device("meta"):  # no time spent initialising 130M weights that are then replaced
        model = VGG(blocks=tuple(blocks), batch_norm=batch_norm.pop(), fc_width=head[0].out_features,
                    dropout=head[2].p, adaptive_pool=True, init="torchvision", num_classes=head[6].out_features,
                    in_chans=tv_model.features[0].in_channels)

    # Both hold their convolutions and batch norms in the same order; the head maps by position.
    ours = [name for name, m in model.blocks.named_modules() if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))]
    theirs = [name for name, m in tv_model.features.named_modules() if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))]
    if len(ours) != len(theirs):
        raise ValueError(f"this torchvision VGG does not map onto ours: {len(theirs)} convolutions and batch "
                         f"norms against our {len(ours)}")
    ours_to_theirs = {f"fc{n}.{p}": f"classifier.{i}.{p}" for n, i in ((6, 0), (7, 3), (8, 6))
                      for p in ("weight", "bias")}
    src = tv_model.state_dict()
    for a, b in zip(ours, theirs):
        for p in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
            if f"features.{b}.{p}" in src:
                ours_to_theirs[f"blocks.{a}.{p}"] = f"features.{b}.{p}"
    dst = model.state_dict()
    missing = sorted(set(src) - set(ours_to_theirs.values()))
    unmatched = sorted(k for k in dst if k not in ours_to_theirs or ours_to_theirs[k] not in src)
    wrong_shape = sorted(k for k in dst if k not in unmatched and dst[k].shape != src[ours_to_theirs[k]].shape)
    if missing or unmatched or wrong_shape:
        raise ValueError(f"this torchvision VGG does not map onto ours: tensors of theirs not mapped {missing[:3]}, "
                         f"of ours not found {unmatched[:3]}, of another shape {wrong_shape[:3]}")
    with torch.no_grad():  # strict; our tensors are copies of theirs, on their device
        model.load_state_dict({ours: src[theirs].clone() for ours, theirs in ours_to_theirs.items()}, assign=True)
    return model


PAPER = PaperSpec(
    name="vgg",
    family="cnn",
    title="Very Deep Convolutional Networks for Large-Scale Image Recognition",
    authors="Simonyan, Zisserman",
    year=2014,
    url="https://arxiv.org/abs/1409.1556",
    model=VGG,
    flavors=FLAVORS,
    inputs="image",
    task="classification",
    data_kwargs=("num_classes", "in_chans", "img_size"),  # the first fully connected layer reads one map size
    defaults=dict(dataset="digits", image_size=32, epochs=20, batch_size=64, lr=1e-3, weight_decay=0.05,
                  warmup_steps=50, label_smoothing=0.1, clip_grad=1.0),
    reference="torchvision.models.vgg11/13/16/19 and vgg*_bn (the torchvision-vgg* flavors)",
    shard_blocks="blocks",
    # the convolutional blocks read the image itself; pooling and the three fully connected layers end the chain
    pipeline=PipelineChain(embed=lambda vgg, images: images, readout=lambda vgg, x: vgg.forward_head(x), first=(),
                           last=("pool", "fc6", "fc7", "fc8", "dropout")),
    pretrained={"torchvision": from_torchvision},
    reference_models=(ReferenceModel("torchvision:vgg11", (8, 3, 64, 64)), ReferenceModel("torchvision:vgg16_bn", (8, 3, 64, 64))),
    # Section 3.1: mini-batch SGD with momentum 0.9, batch 256, weight decay 5e-4, dropout 0.5 (in the
    # model), lr 1e-2 divided by 10 when the validation accuracy stopped improving, three times, stopped
    # after 370K iterations (74 epochs). The plateaus are not given: we divide at 40%, 70% and 90% of
    # the run (our choice). 224x224 crops of images rescaled to a random smallest side S in [256, 512]
    # (multi-scale training, the best of Tables 3-4; here scale:256/224-512/224 of the image size),
    # random horizontal flips and AlexNet's RGB colour shift (std 0.1). No warmup, smoothing or clipping.
    recipe=dict(optimizer="sgd", lr=1e-2, momentum=0.9, weight_decay=5e-4, batch_size=256, epochs=74,
                schedule="step", milestones="0.4,0.7,0.9", gamma=0.1,
                augment=f"scale:{256 / 224:.4f}-{512 / 224:.4f},flip,lighting:0.1",
                label_smoothing=0.0, clip_grad=0.0, warmup_steps=0),
)
