"""Data augmentation of training images, as papers describe it, with torchvision.transforms.v2.

`--augment` names the steps, comma-separated, applied in this order to each training image
(C, N, N) (already normalised; the test split is never augmented); "none" names none, and "auto",
the default, stands for the data set's own (DatasetSpec.augment: crop:4,flip for fashion-mnist):

    scale:LO-HI  resize to a random side in [LO, HI] x N, then a random N x N crop (VGG's scale jittering;
                 LO = HI: one scale, as AlexNet's 256 for 224 crops)
    rrc:MIN      a random crop of MIN to 1 of the area and aspect ratio 3/4 to 4/3, resized to N x N
                 (GoogLeNet's "various sized patches")
    crop:P       pad P pixels on every side (with zeros: the mean after normalisation), random N x N crop
                 (ResNet's and DenseNet's CIFAR augmentation)
    flip         a random horizontal flip
    lighting:S   AlexNet's PCA colour noise: add sum_i alpha_i lambda_i p_i to every pixel, alpha_i from
                 N(0, S), lambda_i, p_i the eigenvalues and eigenvectors of the training pixels' channel
                 covariance (Section 4.1)
    randaug:M-S  timm's RandAugment (Cubuk et al.), as DeiT trains (rand-m9-mstd0.5-inc1): 2 operations of
                 magnitude M (of 10) drawn around M with std S, on the image's 8-bit pixels (data sets whose
                 normalisation is known: DatasetSpec.preprocess)
    erase:P      timm's RandomErasing (Zhong et al.): with probability P one rectangle of random pixels
                 (normal noise, as DeiT's 'pixel' mode), on the normalised image

for segmentation data sets (images of any size), one that warps the image and its target maps together:

    elastic:STD  U-Net's elastic deformation (Section 3.1): displacement vectors of STD pixels on a 3 x 3
                 grid, bicubic in between (common/data/elastic.py; pixels from outside the canvas are void),
                 before the weight map of the paper's loss is computed

and, for classification data sets, three that are not a transform of one image, as DeiT's recipe (Table 9):

    mixup:A      timm's Mixup on each training batch: images and one-hot labels mixed with a weight drawn
                 from Beta(A, A) (Zhang et al.)
    cutmix:A     the same, pasting a rectangle of another image of the batch (Yun et al.); with mixup, one
                 of the two at random for each batch (timm's switch_prob 0.5). The mixed targets (B, classes)
                 carry the label smoothing (--label-smoothing), which the loss then does not add again
    repeat:N     repeated augmentation (Hoffer et al., Berman et al.): timm's RepeatAugSampler puts each image
                 N times in an epoch, each time augmented anew, and an epoch then holds as many images as
                 before (a third of them, each three times, for N = 3)

The random draws come from torch's global generator, whose state checkpoints keep: a resumed
run draws what the uninterrupted one drew (with --num-workers 0).
"""

import torch
from torch.utils.data import Dataset

STEPS = ("scale", "rrc", "crop", "flip", "lighting", "randaug", "erase", "elastic", "mixup", "cutmix", "repeat")
BATCH_STEPS = ("mixup", "cutmix", "repeat")  # not transforms of one image: the trainer's and the sampler's
JOINT_STEPS = ("elastic",)  # transforms of a segmentation sample, its image and target maps together
WANTS = {"scale": 2, "rrc": 1, "crop": 1, "flip": 0, "lighting": 1, "randaug": 2, "erase": 1, "elastic": 1,
         "mixup": 1, "cutmix": 1, "repeat": 1}  # the values each step takes


def parse(text: str) -> list[tuple[str, tuple[float, ...]]]:
    """"crop:4,flip" -> [("crop", (4.0,)), ("flip", ())]; ValueError naming the accepted steps."""
    if text in ("", "none"):
        return []
    steps = []
    for part in text.split(","):
        name, _, arg = part.strip().partition(":")
        try:
            values = tuple(float(v) for v in arg.split("-")) if arg else ()
        except ValueError:
            values = None
        wants = WANTS.get(name)
        if wants is None or values is None or len(values) != wants or any(v < 0 for v in values) or (
                name == "scale" and not 0 < values[0] <= values[1]) or (name == "rrc" and not 0 < values[0] <= 1) or (
                name == "erase" and values[0] > 1) or (name == "repeat" and (values[0] < 1 or values[0] % 1)) or (
                name in ("mixup", "cutmix") and values[0] == 0):
            raise ValueError(f"augment step '{part}' is not one of scale:LO-HI, rrc:MIN, crop:P, flip, lighting:S, "
                             f"randaug:M-S, erase:P, elastic:STD, mixup:A, cutmix:A, repeat:N (e.g. crop:4,flip)")
        steps.append((name, values))
    return steps


class Lighting(torch.nn.Module):
    """AlexNet's PCA colour augmentation on a (C, H, W) image."""

    def __init__(self, std: float, eigenvalues: torch.Tensor, eigenvectors: torch.Tensor):
        super().__init__()
        self.std, self.eigenvalues, self.eigenvectors = std, eigenvalues, eigenvectors

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        alpha = torch.randn(len(self.eigenvalues)) * self.std  # one draw per image
        shift = self.eigenvectors @ (alpha * self.eigenvalues)  # (C,)
        return image + shift[:, None, None]


def channel_pca(dataset: Dataset, samples: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (C,) and eigenvectors (C, C) of the channel covariance of the first images' pixels."""
    pixels = torch.cat([dataset[i][0].flatten(1) for i in range(min(samples, len(dataset)))], dim=1)  # (C, n)
    covariance = torch.cov(pixels)
    values, vectors = torch.linalg.eigh(covariance.reshape(len(pixels), len(pixels)))
    return values.clamp(min=0).sqrt(), vectors  # lambda as the std along each principal direction


class RandAugment(torch.nn.Module):
    """timm's RandAugment (PIL operations) on a normalised (C, H, W) image: back to its 8-bit pixels, the
    operations, and normalised again, as the data set normalised it: (pixel x scale - mean) / std
    (DatasetSpec.preprocess: scale 1/255 for most, 16/255 for the 0-16 digits)."""

    def __init__(self, magnitude: float, std: float, size: int, stats: dict):
        super().__init__()
        from timm.data import rand_augment_transform

        self.scale = stats.get("scale", 1 / 255)
        self.mean, self.sd = (torch.tensor(stats[k], dtype=torch.float32).view(-1, 1, 1) for k in ("mean", "std"))
        fill = tuple(round(m / self.scale) for m in stats["mean"])  # what shifted-in pixels get: the mean
        # DeiT's (timm's create_transform); a magnitude drawn at the top, 10, makes timm's increasing posterize
        # keep 0 bits, which Pillow now refuses: the draws are clipped just below it instead
        hparams = dict(translate_const=int(size * 0.45), img_mean=fill[0] if len(fill) == 1 else fill,
                       magnitude_max=9.99)
        self.ops = rand_augment_transform(f"rand-m{magnitude:g}-mstd{std:g}-inc1", hparams)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as TF

        pixels = ((image * self.sd + self.mean) / self.scale).round().clamp(0, 255).to(torch.uint8)  # (C, H, W)
        out = TF.pil_to_tensor(self.ops(TF.to_pil_image(pixels))).float() * self.scale  # (C, H, W)
        return (out - self.mean) / self.sd


def per_image(text: str) -> list[tuple[str, tuple[float, ...]]]:
    """The steps of an --augment value that transform one image (all but BATCH_STEPS and JOINT_STEPS)."""
    return [(name, values) for name, values in parse(text) if name not in BATCH_STEPS + JOINT_STEPS]


def warped(text: str, dataset: Dataset) -> Dataset:
    """A segmentation training set as an --augment value's elastic:STD step warps it (common.data.elastic),
    or as it is where the value has no such step."""
    steps = dict(parse(text))
    if "elastic" not in steps:
        return dataset
    from common.data.elastic import ElasticDeformation, Warped  # (torchvision, imported only to augment)

    return Warped(dataset, ElasticDeformation(std=steps["elastic"][0]))


def mixing(text: str, num_classes: int | None, label_smoothing: float = 0.0):
    """timm's Mixup for the mixup:A and cutmix:A steps of an --augment value (DeiT's: on every batch, one of
    the two at random when both are given), or None."""
    given = dict(parse(text))
    if "mixup" not in given and "cutmix" not in given:
        return None
    from timm.data import Mixup

    return Mixup(mixup_alpha=given.get("mixup", (0.0,))[0], cutmix_alpha=given.get("cutmix", (0.0,))[0],
                 prob=1.0, switch_prob=0.5, mode="batch", label_smoothing=label_smoothing, num_classes=num_classes)


def mix(mixup, inputs, targets):
    """A training batch (images (B, C, H, W), or {"images": ...}; labels (B,)) mixed by timm's Mixup: the
    images, and targets (B, classes)."""
    images = inputs["images"] if isinstance(inputs, dict) else inputs
    images, targets = mixup(images, targets)
    return ({**inputs, "images": images} if isinstance(inputs, dict) else images), targets


def repeats(text: str) -> int:
    """How many times the repeat:N step of an --augment value shows each sampled image (1: none)."""
    return int(dict(parse(text)).get("repeat", (1,))[0])


def transform(text: str, size: int, dataset: Dataset | None = None, stats: dict | None = None):
    """The training transform of an --augment value for N x N images, or None where it transforms no image.
    `stats`: the data set's preprocessing (mean, std), which randaug needs."""
    parsed = per_image(text)
    if not parsed:
        return None
    from torchvision.transforms import v2  # (imported only to augment: torchvision.ops imports torch._dynamo)

    steps = []
    for name, values in parsed:
        if name == "randaug":
            steps.append(RandAugment(*values, size, stats))
            continue
        if name == "erase":
            from timm.data.random_erasing import RandomErasing

            steps.append(RandomErasing(probability=values[0], mode="pixel", max_count=1, device="cpu"))
            continue
        if name == "scale":
            steps += [v2.RandomResize(round(values[0] * size), round(values[1] * size) + 1, antialias=True),
                      v2.RandomCrop(size)]
        elif name == "rrc":
            steps.append(v2.RandomResizedCrop(size, scale=(values[0], 1.0), ratio=(3 / 4, 4 / 3), antialias=True))
        elif name == "crop":
            steps.append(v2.RandomCrop(size, padding=round(values[0])))
        elif name == "flip":
            steps.append(v2.RandomHorizontalFlip())
        else:
            steps.append(Lighting(values[0], *channel_pca(dataset)))
    return v2.Compose(steps)


class Augmented(Dataset):
    """A training set whose images pass through a transform each time they are read."""

    def __init__(self, dataset: Dataset, augment):
        self.dataset, self.augment = dataset, augment

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        x, y = self.dataset[i]
        return self.augment(x), y
