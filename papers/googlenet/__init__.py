"""GoogLeNet: Szegedy et al., 2014. The spec, and weight loading from torchvision."""

import torch
import torch.nn as nn

from papers import PaperSpec, ReferenceModel
from papers.googlenet.model import FLAVORS, GoogLeNet

# torchvision's transform_input: its pretrained weights read images normalised with mean 0.5 and std 0.5,
# and this maps an ImageNet-normalised image there, channel by channel: x * scale + shift.
TRANSFORM_SCALE = (0.229 / 0.5, 0.224 / 0.5, 0.225 / 0.5)
TRANSFORM_SHIFT = ((0.485 - 0.5) / 0.5, (0.456 - 0.5) / 0.5, (0.406 - 0.5) / 0.5)


def from_torchvision(tv_model: nn.Module) -> GoogLeNet:
    """Our GoogLeNet holding the weights of a torchvision `GoogLeNet` (googlenet, with or without its
    auxiliary classifiers, with or without transform_input, any number of classes): the `torchvision`
    flavor's architecture, read from the model.

    Args:
        tv_model: a `torchvision.models.GoogLeNet` of BasicConv2d (convolution, batch norm with eps
            1e-3, ReLU), Inception and InceptionAux blocks; anything else is a ValueError.
    """
    from torchvision.models.googlenet import BasicConv2d, Inception, InceptionAux
    from torchvision.models.googlenet import GoogLeNet as TorchvisionGoogLeNet

    if not isinstance(tv_model, TorchvisionGoogLeNet):
        raise ValueError(f"expected a torchvision GoogLeNet, got {type(tv_model).__name__}")
    names = ["3a", "3b", "4a", "4b", "4c", "4d", "4e", "5a", "5b"]
    inceptions = [getattr(tv_model, f"inception{n}") for n in names]
    aux = [a for a in (tv_model.aux1, tv_model.aux2) if a is not None]
    for name, m in tv_model.named_modules():
        if isinstance(m, (nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)):
            raise ValueError(f"cannot map {type(m).__name__} ({name}); torchvision's GoogLeNet has batch norm only")
        if isinstance(m, nn.Conv2d) and (m.bias is not None or m.groups != 1 or m.dilation != (1, 1)):
            raise ValueError(f"cannot map the convolution {name} ({m}); ours have no bias, groups or dilation")
        if isinstance(m, nn.BatchNorm2d) and (m.eps != 1e-3 or not m.affine or not m.track_running_stats):
            raise ValueError(f"cannot map the batch norm {name} ({m}); ours is affine with eps 1e-3")
    convs = [tv_model.conv1, tv_model.conv2, tv_model.conv3]
    blocks = [*convs, *(b for i in inceptions for b in (i.branch1, *i.branch2, *i.branch3, i.branch4[1])),
              *(a.conv for a in aux)]
    if not all(isinstance(b, BasicConv2d) and isinstance(b.bn, nn.BatchNorm2d) for b in blocks) or not all(
            isinstance(i, Inception) for i in inceptions) or not all(isinstance(a, InceptionAux) for a in aux):
        raise ValueError("cannot map a torchvision GoogLeNet built of other blocks than BasicConv2d, Inception and "
                         "InceptionAux")
    if tv_model.aux1 is None and tv_model.aux2 is not None or tv_model.aux1 is not None and tv_model.aux2 is None:
        raise ValueError("cannot map a torchvision GoogLeNet with one auxiliary classifier; ours has both or none")
    c1, c2, c3 = (c.conv for c in convs)
    pools = [tv_model.maxpool1, tv_model.maxpool2, tv_model.maxpool3, tv_model.maxpool4]
    if ((c1.kernel_size, c1.stride, c1.padding) != ((7, 7), (2, 2), (3, 3)) or c2.kernel_size != (1, 1)
            or (c3.kernel_size, c3.padding) != ((3, 3), (1, 1))
            or any(not p.ceil_mode or p.stride != 2 or p.padding != 0 for p in pools)
            or (pools[0].kernel_size, pools[1].kernel_size) != (3, 3)):
        raise ValueError("cannot map a torchvision GoogLeNet whose stem is not conv 7x7/2, max pool 3x3/2, conv 1x1, "
                         "conv 3x3, max pool 3x3/2 (ceil mode)")
    k5 = {i.branch3[1].conv.kernel_size for i in inceptions}
    if len(k5) != 1 or next(iter(k5))[0] not in (3, 5) or any(i.branch3[1].conv.padding[0] != i.branch3[1].conv.kernel_size[0] // 2 for i in inceptions):
        raise ValueError(f"cannot map the branches of kernels {sorted(k5)}; ours share one kernel, 3 or 5, padded")
    if aux and {(a.conv.conv.out_channels, a.fc1.out_features, a.dropout.p) for a in aux} != {
            (aux[0].conv.conv.out_channels, aux[0].fc1.out_features, aux[0].dropout.p)}:
        raise ValueError("cannot map two different auxiliary classifiers; ours share their widths and dropout")

    with torch.device("meta"):  # its weights are replaced below: no time spent initialising them
        model = GoogLeNet(
            stages=tuple(tuple((i.branch1.conv.out_channels, i.branch2[0].conv.out_channels, i.branch2[1].conv.out_channels,
                                i.branch3[0].conv.out_channels, i.branch3[1].conv.out_channels,
                                i.branch4[1].conv.out_channels) for i in stage)
                         for stage in (inceptions[:2], inceptions[2:7], inceptions[7:])),
            stem=dict(widths=(c1.out_channels, c2.out_channels, c3.out_channels)),
            pool_kernels=(pools[2].kernel_size, pools[3].kernel_size),
            aux_at=("4a", "4d"),
            aux_widths=(aux[0].conv.conv.out_channels, aux[0].fc1.out_features) if aux else (128, 1024),
            aux_adaptive=True,  # InceptionAux pools to 4x4 adaptively
            aux_logits=bool(aux),
            dropout=tv_model.dropout.p,
            aux_dropout=aux[0].dropout.p if aux else 0.7,
            lrn=False,
            batch_norm=True,
            k5=next(iter(k5))[0],
            init="torchvision",
            num_classes=tv_model.fc.out_features,
            in_chans=c1.in_channels,
        )

    def theirs(ours: str) -> str:
        for a, b in (("stem.conv1.", "conv1."), ("stem.conv2_reduce.", "conv2."), ("stem.conv2.", "conv3."),
                     ("aux.4a.", "aux1."), ("aux.4d.", "aux2.")):
            if ours.startswith(a):
                return b + ours[len(a):]
        if ours.startswith("inceptions."):
            _, i, rest = ours.split(".", 2)
            return f"inception{names[int(i)]}.{rest}"
        return ours  # fc

    src, dst = tv_model.state_dict(), model.state_dict()
    ours_to_theirs = {k: theirs(k) for k in dst if k not in ("input_scale", "input_shift")}
    missing = sorted(set(src) - set(ours_to_theirs.values()))
    unmatched = sorted(k for k, v in ours_to_theirs.items() if v not in src)
    wrong_shape = sorted(k for k, v in ours_to_theirs.items() if k not in unmatched and dst[k].shape != src[v].shape)
    if missing or unmatched or wrong_shape:
        raise ValueError(f"this torchvision GoogLeNet does not map onto ours: tensors of theirs not mapped "
                         f"{missing[:3]}, of ours not found {unmatched[:3]}, of another shape {wrong_shape[:3]}")
    state = {ours: src[theirs].clone() for ours, theirs in ours_to_theirs.items()}
    scale, shift = (TRANSFORM_SCALE, TRANSFORM_SHIFT) if tv_model.transform_input else ((1.0,) * 3, (0.0,) * 3)
    state |= {"input_scale": torch.tensor(scale).to(src["fc.weight"]),
              "input_shift": torch.tensor(shift).to(src["fc.weight"])}
    with torch.no_grad():  # strict; our tensors are copies of theirs, on their device
        model.load_state_dict(state, assign=True)
    return model


PAPER = PaperSpec(
    name="googlenet",
    family="cnn",
    title="Going Deeper with Convolutions",
    authors="Szegedy, Liu, Jia, Sermanet, Reed, Anguelov, Erhan, Vanhoucke, Rabinovich",
    year=2014,
    url="https://arxiv.org/abs/1409.4842",
    model=GoogLeNet,
    flavors=FLAVORS,
    inputs="image",
    task="classification",
    data_kwargs=("num_classes", "in_chans", "img_size"),  # the auxiliary classifiers' first layer reads one grid
    defaults=dict(dataset="digits", image_size=32, epochs=20, batch_size=64, lr=2e-3, weight_decay=0.05,
                  warmup_steps=50, label_smoothing=0.1, clip_grad=1.0),
    reference="torchvision.models.googlenet (the torchvision flavor)",
    shard_blocks="inceptions",
    pretrained={"torchvision": from_torchvision},
    reference_models=(ReferenceModel("torchvision:googlenet", (16, 3, 64, 64), {"init_weights": False}),),
    # Section 6: asynchronous SGD with momentum 0.9 on many CPU machines (DistBelief), the learning rate
    # decreased by 4% every 8 epochs (here smoothly: 0.96^(1/8) after every epoch), Polyak averaging of
    # the weights for the final model (none here), patches of 8% to 100% of the area with aspect ratios
    # 3/4 to 4/3 and horizontal flips (Howard's photometric distortions and random interpolation methods:
    # none here). The paper gives no learning rate, batch size, weight decay or length: lr 0.01, batch
    # 32 and weight decay 2e-4 are the BVLC Caffe reference's (models/bvlc_googlenet/solver.prototxt,
    # train_val.prototxt); the length stays the repo's. Synchronous SGD here, not asynchronous.
    recipe=dict(optimizer="sgd", lr=0.01, momentum=0.9, weight_decay=2e-4, batch_size=32,
                schedule="exponential", gamma=0.96 ** (1 / 8), augment="rrc:0.08,flip",
                label_smoothing=0.0, clip_grad=0.0, warmup_steps=0),
)
