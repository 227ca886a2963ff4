"""MobileNetV2: Sandler et al., 2018. The spec, and weight loading from torchvision."""

import torch.nn as nn

from common.pretrained import load_mapped
from papers import PaperSpec, ReferenceModel
from papers.mobilenetv2.model import FLAVORS, ConvBN, MobileNetV2

NORM = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _conv_bn_act(m: nn.Module, name: str, linear: bool = False) -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    """The convolution and batch norm of torchvision's Conv2dNormActivation (ReLU6 after them), or of
    a projection's plain (conv, bn) pair; a ValueError names anything else."""
    parts = list(m.children()) if isinstance(m, nn.Sequential) else [m]
    kinds = [type(p) for p in parts]
    want = [nn.Conv2d, nn.BatchNorm2d] if linear else [nn.Conv2d, nn.BatchNorm2d, nn.ReLU6]
    if kinds != want:
        raise ValueError(f"cannot map {name}: {[k.__name__ for k in kinds]}, where the paper has "
                         f"{[k.__name__ for k in want]}")
    conv, bn = parts[0], parts[1]
    if conv.bias is not None or conv.dilation != (1, 1) or conv.padding != ((conv.kernel_size[0] - 1) // 2,) * 2:
        raise ValueError(f"cannot map {name}'s convolution (bias, dilation or padding differ from the paper's)")
    if bn.eps != 1e-5 or not bn.affine or not bn.track_running_stats:
        raise ValueError(f"cannot map {name}'s batch norm with eps {bn.eps}; ours is nn.BatchNorm2d's default")
    return conv, bn


def from_torchvision(tv_model: nn.Module) -> MobileNetV2:
    """Our MobileNetV2 holding the weights of a torchvision `MobileNetV2` (mobilenet_v2 at any width_mult,
    round_nearest, inverted_residual_setting, dropout or number of classes).

    Args:
        tv_model: a `torchvision.models.MobileNetV2` built of its InvertedResidual blocks with
            nn.BatchNorm2d; another block or norm layer, a kernel size other than 3 or a classifier
            other than dropout and one linear layer is refused with a ValueError.
    """
    from torchvision.models.mobilenetv2 import InvertedResidual
    from torchvision.models.mobilenetv2 import MobileNetV2 as TorchvisionMobileNetV2

    if not isinstance(tv_model, TorchvisionMobileNetV2):
        raise ValueError(f"expected a torchvision MobileNetV2, got {type(tv_model).__name__}")
    features = list(tv_model.features)
    if len(features) < 3 or not all(isinstance(b, InvertedResidual) for b in features[1:-1]):
        raise ValueError("cannot map a torchvision MobileNetV2 whose features are not a stem, InvertedResidual "
                         "blocks and a last 1x1 convolution")
    classifier = list(tv_model.classifier) if isinstance(tv_model.classifier, nn.Sequential) else [tv_model.classifier]
    if [type(m) for m in classifier] != [nn.Dropout, nn.Linear]:
        raise ValueError(f"cannot map the classifier {[type(m).__name__ for m in classifier]}; ours is dropout "
                         "and one linear layer")

    # our tensor -> theirs, and the structure read from their layers, one Table 2 row per block
    ours_to_theirs = {"fc.weight": "classifier.1.weight", "fc.bias": "classifier.1.bias"}

    def pair(ours: str, conv_key: str, bn_key: str, module: nn.Module, name: str, linear: bool = False,
             kernel: int = 1) -> nn.Conv2d:
        """Map our ConvBN `ours` onto their convolution and batch norm; check the kernel size."""
        conv, _ = _conv_bn_act(module, name, linear)
        if conv.kernel_size != (kernel, kernel):
            raise ValueError(f"cannot map {name}'s {conv.kernel_size[0]}x{conv.kernel_size[1]} convolution; "
                             f"the paper's is {kernel}x{kernel}")
        ours_to_theirs[f"{ours}.conv.weight"] = f"{conv_key}.weight"
        ours_to_theirs.update({f"{ours}.bn.{p}": f"{bn_key}.{p}" for p in NORM})
        return conv

    stem = pair("stem", "features.0.0", "features.0.1", features[0], "the stem", kernel=3)
    settings = []
    for i, block in enumerate(features[1:-1]):
        layers, theirs = list(block.conv), f"features.{i + 1}.conv"
        if len(layers) not in (3, 4):
            raise ValueError(f"cannot map block {i + 1} of {len(layers)} layers; the paper's has 3 (t = 1) or 4")
        k = len(layers) - 3  # [pw (t > 1 only), dw, pw-linear conv, its bn]
        if k:
            conv = pair(f"blocks.{i}.expand", f"{theirs}.0.0", f"{theirs}.0.1", layers[0], f"block {i + 1}'s expansion")
            in_chans = conv.in_channels
        dw = pair(f"blocks.{i}.depthwise", f"{theirs}.{k}.0", f"{theirs}.{k}.1", layers[k], f"block {i + 1}'s depthwise",
                  kernel=3)
        hidden = dw.in_channels
        if not k:
            in_chans = hidden
        if dw.groups != hidden:
            raise ValueError(f"cannot map block {i + 1}: its 3x3 convolution is not depthwise")
        pair(f"blocks.{i}.project", f"{theirs}.{k + 1}", f"{theirs}.{k + 2}", nn.Sequential(*layers[k + 1:]),
             f"block {i + 1}'s projection", linear=True)
        settings.append((hidden / in_chans, block.out_channels, 1, block.stride))
    last = pair("conv_last", f"features.{len(features) - 1}.0", f"features.{len(features) - 1}.1", features[-1],
                "the last 1x1 convolution")

    model = MobileNetV2(
        width_mult=1.0,  # the channels are read from their layers and kept as they are
        settings=tuple(settings),
        stem_chans=stem.out_channels,
        stem_stride=stem.stride[0],
        last_chans=last.out_channels,
        round_nearest=1,
        dropout=classifier[0].p,
        num_classes=classifier[1].out_features,
        in_chans=stem.in_channels,
    )
    return load_mapped(model, tv_model, ours_to_theirs, "torchvision MobileNetV2")


PAPER = PaperSpec(
    name="mobilenetv2",
    family="cnn",
    title="MobileNetV2: Inverted Residuals and Linear Bottlenecks",
    authors="Sandler, Howard, Zhu, Zhmoginov, Chen",
    year=2018,
    url="https://arxiv.org/abs/1801.04381",
    model=MobileNetV2,
    flavors=FLAVORS,
    inputs="image",
    task="classification",
    data_kwargs=("num_classes", "in_chans"),
    defaults=dict(dataset="digits", image_size=32, epochs=20, batch_size=64, lr=3e-3, weight_decay=0.05,
                  warmup_steps=50, label_smoothing=0.1, clip_grad=1.0),
    reference="torchvision.models.mobilenet_v2 (any width_mult)",
    shard_blocks="blocks",
    padded_batches=True,
    pretrained={"torchvision": from_torchvision},
    reference_models=(ReferenceModel("torchvision:mobilenet_v2", (16, 3, 64, 64)),),
    # Section 6.1, ImageNet: RMSProp with decay 0.9 and momentum 0.9, weight decay 4e-5, lr 0.045 decayed
    # by 0.98 per epoch, 16 asynchronous GPU workers with a batch of 96. Asynchronous workers each apply
    # their own updates of 96 images, so each optimizer step here takes 96 (not 16 x 96 = 1,536, which
    # would be a synchronous run's global batch at another learning rate). The paper gives no number of
    # epochs; we take 200, after which 0.98 per epoch has brought the lr under 2% of its start. Standard
    # Inception preprocessing: random-resized crops of 8% to 100% of the area and horizontal flips.
    # RMSProp's epsilon is torch's default; the trainer decays only weight matrices.
    recipe=dict(optimizer="rmsprop", lr=0.045, momentum=0.9, weight_decay=4e-5, batch_size=96, epochs=200,
                schedule="exponential", gamma=0.98, augment="rrc:0.08,flip", label_smoothing=0.0,
                clip_grad=0.0, warmup_steps=0),
)
