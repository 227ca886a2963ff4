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

The random draws come from torch's global generator, whose state checkpoints keep: a resumed
run draws what the uninterrupted one drew (with --num-workers 0).
"""

import torch
from torch.utils.data import Dataset

STEPS = ("scale", "rrc", "crop", "flip", "lighting")


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
        wants = {"scale": 2, "rrc": 1, "crop": 1, "flip": 0, "lighting": 1}.get(name)
        if wants is None or values is None or len(values) != wants or any(v < 0 for v in values) or (
                name == "scale" and not 0 < values[0] <= values[1]) or (name == "rrc" and not 0 < values[0] <= 1):
            raise ValueError(f"augment step '{part}' is not one of scale:LO-HI, rrc:MIN, crop:P, flip, lighting:S "
                             f"(e.g. crop:4,flip)")
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


def transform(text: str, size: int, dataset: Dataset | None = None):
    """The training transform of an --augment value for N x N images, or None for "none"."""
    parsed = parse(text)
    if not parsed:
        return None
    from torchvision.transforms import v2  # (imported only to augment: torchvision.ops imports torch._dynamo)

    steps = []
    for name, values in parsed:
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
