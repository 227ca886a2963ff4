"""AlexNet: Krizhevsky, Sutskever, Hinton, 2012. The spec, and weight loading from torchvision."""

import torch
import torch.nn as nn

from papers import PaperSpec, ReferenceModel
from papers.alexnet.model import FLAVORS, TORCHVISION, AlexNet, Figure1Net

# torchvision's AlexNet.features: (index, kind, (kernel, stride, padding)) of every layer but the ReLUs.
TORCHVISION_FEATURES = [(0, "conv", (11, 4, 2)), (2, "pool", (3, 2, 0)), (3, "conv", (5, 1, 2)), (5, "pool", (3, 2, 0)),
                        (6, "conv", (3, 1, 1)), (8, "conv", (3, 1, 1)), (10, "conv", (3, 1, 1)), (12, "pool", (3, 2, 0))]


def _pair(v) -> int:
    return v[0] if isinstance(v, tuple) and len(set(v)) == 1 else v


def from_torchvision(tv_model: nn.Module) -> AlexNet:
    """Our AlexNet (the "torchvision" flavor's layout) holding the weights of a torchvision `AlexNet`
    (`torchvision.models.alexnet`, any number of classes, any dropout).

    Args:
        tv_model: a `torchvision.models.AlexNet`. One whose layers were changed (kernel sizes, strides,
            paddings, grouped or dilated convolutions, pooling, the classifier's layout) is refused with a
            ValueError naming what differs.
    """
    from torchvision.models.alexnet import AlexNet as TorchvisionAlexNet

    if not isinstance(tv_model, TorchvisionAlexNet):
        raise ValueError(f"expected a torchvision AlexNet, got {type(tv_model).__name__}")
    features, classifier = tv_model.features, tv_model.classifier
    differs = []
    if len(features) != 13:
        differs.append(f"features has {len(features)} layers, not 13")
    for i, kind, (k, s, p) in TORCHVISION_FEATURES:
        m = features[i] if i < len(features) else None
        if kind == "conv" and not (isinstance(m, nn.Conv2d) and m.groups == 1 and _pair(m.dilation) == 1
                                   and m.bias is not None
                                   and (_pair(m.kernel_size), _pair(m.stride), _pair(m.padding)) == (k, s, p)):
            differs.append(f"features.{i} is not a {k}x{k} convolution with stride {s}, padding {p}, groups 1")
        if kind == "pool" and not (isinstance(m, nn.MaxPool2d) and m.ceil_mode is False and _pair(m.dilation) == 1
                                   and (_pair(m.kernel_size), _pair(m.stride), _pair(m.padding)) == (k, s, p)):
            differs.append(f"features.{i} is not a {k}x{k} max pool with stride {s}")
    for i in (1, 4, 7, 9, 11):
        if i < len(features) and not isinstance(features[i], nn.ReLU):
            differs.append(f"features.{i} is {type(features[i]).__name__}, not ReLU")
    pool = tv_model.avgpool
    if not (isinstance(pool, nn.AdaptiveAvgPool2d) and _pair(pool.output_size) in (6, (6, 6))):
        differs.append("avgpool is not an adaptive average pool to 6x6")
    kinds = [type(m).__name__ for m in classifier]
    if kinds != ["Dropout", "Linear", "ReLU", "Dropout", "Linear", "ReLU", "Linear"]:
        differs.append(f"the classifier is {kinds}, not dropout, fc6, ReLU, dropout, fc7, ReLU, fc8")
    elif classifier[0].p != classifier[3].p:
        differs.append(f"the classifier's dropouts differ ({classifier[0].p} and {classifier[3].p})")
    if differs:
        raise ValueError("cannot map this torchvision AlexNet: " + "; ".join(differs))

    convs = [features[i] for i, kind, _ in TORCHVISION_FEATURES if kind == "conv"]
    with torch.device("meta"):  # no initialisation: every tensor is theirs below
            model = AlexNet(**{**TORCHVISION, "num_classes": classifier[6].out_features, "in_chans": convs[0].in_channels,
                           "widths": tuple(c.out_channels for c in convs), "hidden": classifier[1].out_features,
                           "dropout": classifier[0].p})
    ours_to_theirs = {}
    for j, c in enumerate(i for i, kind, _ in TORCHVISION_FEATURES if kind == "conv"):
        ours_to_theirs |= {f"layers.{j}.conv.{p}": f"features.{c}.{p}" for p in ("weight", "bias")}
    for ours, c in (("fc6", 1), ("fc7", 4), ("fc8", 6)):
        ours_to_theirs |= {f"{ours}.{p}": f"classifier.{c}.{p}" for p in ("weight", "bias")}

    src, dst = tv_model.state_dict(), model.state_dict()
    missing = sorted(set(src) - set(ours_to_theirs.values()))
    unmatched = sorted(k for k in dst if k not in ours_to_theirs or ours_to_theirs[k] not in src)
    wrong_shape = sorted(k for k in dst if k not in unmatched and dst[k].shape != src[ours_to_theirs[k]].shape)
    if missing or unmatched or wrong_shape:
        raise ValueError(f"this torchvision AlexNet does not map onto ours: tensors of theirs not mapped {missing[:3]}, "
                         f"of ours not found {unmatched[:3]}, of another shape {wrong_shape[:3]}")
    with torch.no_grad():  # strict; copies, on their device
        model.load_state_dict({ours: src[theirs].clone() for ours, theirs in ours_to_theirs.items()}, assign=True)
    return model.train(tv_model.training)


PAPER = PaperSpec(
    name="alexnet",
    family="cnn",
    title="ImageNet Classification with Deep Convolutional Neural Networks",
    authors="Krizhevsky, Sutskever, Hinton",
    year=2012,
    url="https://papers.nips.cc/paper/4824-imagenet-classification-with-deep-convolutional-neural-networks",
    model=AlexNet,
    flavors=FLAVORS,
    inputs="image",
    task="classification",
    data_kwargs=("num_classes", "in_chans", "img_size"),
    # the repo's recipe: AdamW with warmup and cosine decay, on the digits resized to 32x32
    defaults=dict(dataset="digits", image_size=32, epochs=20, batch_size=64, lr=1e-3, weight_decay=0.05,
                  warmup_steps=50, label_smoothing=0.1, clip_grad=1.0),
    # The paper's recipe (Section 5, Section 4.1). Its learning rate was divided by 10 "when the validation
    # error rate stopped improving", three times in about 90 cycles; no schedule here watches the
    # validation error, so the three divisions are fixed steps at 1/4, 1/2 and 3/4 of the run (our
    # choice, not the paper's). Augmentation: random 224x224 crops of images rescaled to 256 (scale
    # 256/224 of the training size, then a random crop back) with horizontal flips, and the PCA colour
    # noise with standard deviation 0.1. Its 10-patch test-time averaging is not done here.
    recipe=dict(optimizer="sgd", lr=0.01, momentum=0.9, nesterov=False, weight_decay=5e-4, batch_size=128, epochs=90,
                schedule="step", milestones="0.25,0.5,0.75", gamma=0.1, warmup_steps=0, label_smoothing=0.0,
                clip_grad=0.0, augment=f"scale:{256 / 224:.4f}-{256 / 224:.4f},flip,lighting:0.1"),
    reference="torchvision.models.alexnet (the one-tower model, flavor 'torchvision')",
    shard_blocks="layers",
    padded_batches=False,
    pretrained={"torchvision": from_torchvision},
    reference_models=(ReferenceModel("torchvision:alexnet", (16, 3, 64, 64)),),
    # Figure 1's four-layer network, on the shapes (32x32 colour images, as CIFAR-10's): SGD with momentum
    # 0.9 at a constant rate and "no regularization of any kind" (no weight decay, dropout, augmentation,
    # label smoothing or clipping). The paper chose each network's rate "to make training as fast as
    # possible": papers/alexnet/claims/relu-vs-tanh.yaml sweeps it.
    variants={"figure-1": dict(model=Figure1Net, pretrained={}, recipe={}, reference_models=(),
                               reference="none: Figure 1's network is not published; checked against its shapes",
                               defaults=dict(dataset="shapes", epochs=10, batch_size=128, optimizer="sgd", lr=0.01,
                                             momentum=0.9, weight_decay=0.0, schedule="constant", warmup_steps=0,
                                             label_smoothing=0.0, clip_grad=0.0))},
)
