"""What reaches VGG's output at initialisation: the networks of table-3.yaml (width 0.25, FC-128, the
paper's Glorot uniform initialisation), drawn with seeds 0, 1, 2, read the first 64 training images of
the shapes; printed is how much the 10 logits vary from image to image (their standard deviation over
the batch, averaged over the logits). A net whose output barely depends on its input starts with almost
no gradient to learn from. Added after the sweep's results (most runs stayed at chance), to see why.

    python -m papers.vgg.claims.init_signal
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

FLAVORS = ("VGG-11", "VGG-11-LRN", "VGG-13", "VGG-16", "VGG-19")
KWARGS = dict(width=0.25, fc_width=128)


def spread(flavor: str, seed: int, images: torch.Tensor) -> float:
    """The logits' standard deviation over the images, averaged over the classes, of the net drawn by `seed`."""
    import torch

    from papers import get_paper

    spec = get_paper("vgg").for_flavor(flavor)
    torch.manual_seed(seed)  # the sweep's seeds, not necessarily the very draws of its runs
    model = spec.model(**(dict(spec.flavors[flavor]) | KWARGS | dict(num_classes=10, in_chans=3, img_size=32)))
    with torch.no_grad():
        return model.eval()(images).std(0).mean().item()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m papers.vgg.claims.init_signal", description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=64, help="training images of the shapes to read")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from common.data import get_dataset

    train, _ = get_dataset("shapes").read()
    images = torch.stack([train[i][0] for i in range(args.images)])
    print("| flavor | seed 0 | seed 1 | seed 2 |\n|---|---|---|---|")
    for flavor in FLAVORS:
        print(f"| {flavor} | " + " | ".join(f"{spread(flavor, s, images):.1e}" for s in (0, 1, 2)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
