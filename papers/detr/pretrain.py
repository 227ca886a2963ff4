"""The tiny flavor's pretrained backbone, as the paper's is pretrained on ImageNet.

"The backbone is with ImageNet-pretrained ResNet model from torchvision with frozen batchnorm
layers" (Section 4). DETR is not trained from scratch: its detection training starts from a
classifier's features, and its set loss has to teach only where the objects are. tiny's backbone
(the two-stage ResNet of model.py) is pretrained the same way on the images it will look at: one
digit of the digits' training split, scaled 1x to 4x as digits-detect draws them (8 to 32 pixels),
at a random spot of a black 48 x 48 canvas, classified through global average pooling and a linear
layer (the classifier is dropped afterwards, as DETR drops the ResNet's). No test digit is seen.

    python -m papers.detr.pretrain        # writes papers/detr/tiny_backbone.safetensors

Fixed seed and steps: the file in the repository is what this command writes (about 3 minutes on
two CPU cores). The tiny flavor loads it (`backbone_weights`); its batch norm is then frozen, as the
paper's.
"""

import argparse
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

from common.data import detect, digits
from papers.detr.model import BACKBONE_DIR, Backbone, FLAVORS

WEIGHTS = FLAVORS["tiny"]["backbone_weights"]  # a file in papers/detr (BACKBONE_DIR)
SIDE = 48  # the canvas: the smallest digits-detect side
STEPS, BATCH, LR, WEIGHT_DECAY, SEED = 3000, 64, 1e-3, 1e-4, 0


def glyphs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The digits' fixed split as (N, 8, 8) in [0, 1] and their labels: train, test."""
    x_train, x_test, y_train, y_test = digits.split_digits()
    as_glyphs = lambda x: torch.from_numpy(x).float() / 16
    return as_glyphs(x_train), torch.from_numpy(y_train), as_glyphs(x_test), torch.from_numpy(y_test)


def canvases(pool: torch.Tensor, labels: torch.Tensor, n: int, g: torch.Generator
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """n canvases (n, 3, SIDE, SIDE), each one digit of `pool` scaled as digits-detect scales them, and
    their labels (n,)."""
    images = torch.zeros(n, 1, SIDE, SIDE)
    idx = torch.randint(len(pool), (n,), generator=g)
    lo, hi = detect.SCALE
    for j, k in enumerate(idx.tolist()):
        side = round(8 * (lo + (hi - lo) * float(torch.rand((), generator=g))))
        patch = F.interpolate(pool[k][None, None], size=(side, side), mode="bilinear", align_corners=False)[0]
        top, left = (int(torch.randint(SIDE - side + 1, (), generator=g)) for _ in range(2))
        images[j, :, top:top + side, left:left + side] = patch.clamp(0, 1)
    return images.expand(n, 3, SIDE, SIDE), labels[idx]


class Classifier(nn.Module):
    """The backbone, global average pooling and a linear layer over the 10 digits."""

    def __init__(self):
        super().__init__()
        self.backbone = Backbone(FLAVORS["tiny"]["backbone"], frozen_bn=False, trainable_stages=None)
        self.fc = nn.Linear(self.backbone.num_channels, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(self.backbone(images)[0].mean((2, 3)))  # (B, 10)


def pretrain(steps: int = STEPS, seed: int = SEED) -> tuple[Classifier, float]:
    """The classifier after `steps` of AdamW with warmup and cosine decay, and its accuracy (in eval
    mode: batch norm on its running statistics, as the frozen backbone uses them) on 1,000 canvases
    of the test digits."""
    torch.manual_seed(seed)
    train_pool, train_labels, test_pool, test_labels = glyphs()
    model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1, (s + 1) / warmup) * 0.5 * (
        1 + torch.cos(torch.tensor(torch.pi * s / steps)).item()))
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        images, labels = canvases(train_pool, train_labels, BATCH, g)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    with torch.no_grad():
        images, labels = canvases(test_pool, test_labels, 1000, torch.Generator().manual_seed(seed + 1))
        accuracy = (model(images).argmax(1) == labels).float().mean().item()
    return model, accuracy


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Pretrain DETR tiny's backbone on the digits (see the docstring).")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--out", default=str(Path(BACKBONE_DIR) / WEIGHTS))
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    start = time.perf_counter()
    model, accuracy = pretrain(args.steps)
    save_file({k: v.contiguous() for k, v in model.backbone.state_dict().items()}, args.out)
    print(f"{args.steps} steps in {time.perf_counter() - start:.0f} s; test-digit accuracy {accuracy:.4f}; "
          f"backbone written to {args.out}")


if __name__ == "__main__":
    main()
