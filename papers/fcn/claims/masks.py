"""One test canvas segmented by FCN-32s, FCN-16s and FCN-8s: the boundaries of Table 2's claim, seen.

    python -m papers.fcn.claims.masks        # after: python -m common.sweep papers/fcn/claims/table-2.yaml --parallel 2

Reads the finished runs of table-2.yaml (runs/fcn-table-2/*/config.json with model.safetensors), takes
seed 0 of each variant, and draws one canvas of fashion-canvas's test split (the first by default: 64 x 72,
four items) with its true classes and each variant's, side by side, into papers/fcn/claims/table-2-masks.png.
The painting is common.predict's (each class in PASCAL VOC's colour over the grey canvas, class 0 and the
true mask's void band left unpainted). A variant without a finished run of that seed is one line, exit 2.
"""

import argparse
import json
import sys
from pathlib import Path

SWEEP = "fcn-table-2"
VARIANTS = ("32s", "16s", "8s")  # coarse to fine: Table 2's rows
OUT = Path(__file__).with_name("table-2-masks.png")


def finished_runs(folder: Path, seed: int) -> dict[str, Path]:
    """Variant: the finished run of that seed (config.json and model.safetensors) in a sweep's folder."""
    from papers.fcn.model import FLAVORS

    runs = {}
    for config in sorted(folder.glob("*/config.json")):
        cfg = json.loads(config.read_text())
        flavor = FLAVORS.get(cfg.get("flavor", "tiny"), {})
        variant = (cfg.get("model_kwargs") or {}).get("variant", flavor.get("variant"))
        if cfg.get("seed", 0) == seed and (config.parent / "model.safetensors").is_file():
            runs[variant] = config.parent
    return runs


def predicted(run_dir: Path, image) -> "np.ndarray":
    """A run's class of every pixel (H, W) of one canvas (1, H, W), as the test split gives it (normalised)."""
    import torch

    from common.predict import label_map, run_model

    model, _ = run_model(run_dir, "segmentation")
    with torch.no_grad():
        scores = model(image[None])["out"][0]  # (K, H, W)
    return label_map(scores.numpy(), (image.shape[-1], image.shape[-2]))


def panel(picture, title: str):
    """A drawn mask with its title above it."""
    from PIL import Image, ImageDraw

    framed = Image.new("RGB", (picture.width, picture.height + 18))
    framed.paste(picture, (0, 18))
    ImageDraw.Draw(framed).text((4, 3), title, fill="white")
    return framed


def save_side_by_side(panels: list, out: Path, gap: int = 8) -> None:
    """Pictures in one row, `gap` pixels apart, saved to `out`."""
    from PIL import Image

    row = Image.new("RGB", (sum(p.width for p in panels) + gap * (len(panels) - 1), max(p.height for p in panels)))
    for i, p in enumerate(panels):
        row.paste(p, (sum(q.width + gap for q in panels[:i]), 0))
    out.parent.mkdir(parents=True, exist_ok=True)
    row.save(out)


def draw(folder: Path, out: Path, seed: int = 0, index: int = 0) -> dict:
    """Draws the canvas, its true mask and each variant's into `out`; returns {"true" or variant: (H, W) classes}.
    SystemExit naming what is missing where a variant has no finished run of that seed."""
    runs = finished_runs(folder, seed)
    missing = [v for v in VARIANTS if v not in runs]
    if missing:
        raise SystemExit(f"masks: no finished FCN-{', FCN-'.join(missing)} run of seed {seed} in {folder}; run "
                         f"python -m common.sweep papers/fcn/claims/table-2.yaml first")
    import numpy as np
    from PIL import Image

    from common.data import canvas
    from common.data.collate import IGNORE_INDEX
    from common.predict import draw_mask

    data_dir = json.loads((runs["8s"] / "config.json").read_text()).get("data_dir")  # where its items were read
    test = canvas.load(data_dir)[1]
    image, target = test[index]  # (1, H, W) normalised, {"labels": (H, W), ...}
    grey = Image.fromarray(test.maps[index]["pixels"].numpy())  # the canvas as drawn, (H, W) uint8
    true = target["labels"].numpy().astype(np.uint8)
    masks = {"true": np.where(true == IGNORE_INDEX, 0, true)}  # the void band unpainted
    masks |= {v: predicted(runs[v], image) for v in VARIANTS}
    titles = {"true": f"test canvas {index}: the truth"} | {v: f"FCN-{v}, seed {seed}" for v in VARIANTS}
    panels = [panel(draw_mask(grey, labels, canvas.CLASSES), titles[k]) for k, labels in masks.items()]
    save_side_by_side(panels, out)
    return masks


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", default="runs", help="where common.sweep put the sweep's runs (runs)")
    parser.add_argument("--seed", type=int, default=0, help="whose runs are drawn (0)")
    parser.add_argument("--canvas", type=int, default=0, help="which canvas of the test split (0)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the picture ({OUT.name} beside this file)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        draw(Path(args.runs_dir) / SWEEP, args.out, args.seed, args.canvas)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    print(f"drew test canvas {args.canvas} and FCN-32s, -16s and -8s of seed {args.seed} into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
