"""One test canvas whose items touch, parted by U-Net with and without the weight map: Figure 3's claim, seen.

    python -m papers.unet.claims.parted      # after: python -m common.sweep papers/unet/claims/weighted-loss.yaml --parallel 2

Reads the finished runs of weighted-loss.yaml (runs/unet-weighted-loss/*/config.json with model.safetensors),
takes seed 0 of each arm, and draws one canvas of fashion-canvas's test split (by default the first whose
items touch, as instances.py tells them) into papers/unet/claims/weighted-loss-parted.png, side by side:
the true items, each in its own colour; the weight map of equation 2 that training with --pixel-weights
paper puts on that canvas (white its largest weight); and each arm's predicted items, the connected
components of its foreground as instances.py counts them, each in its own colour, with the items matched
at IoU >= 0.5 in the title. The void band is left unpainted. An arm without a finished run of that seed
is one line, exit 2.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from papers.unet.claims import instances as inst

OUT = Path(__file__).with_name("weighted-loss-parted.png")
TITLES = {"paper": "with the weight map", "none": "plain cross-entropy"}


def first_touching(test) -> int:
    """The index of the first test canvas two of whose items touch."""
    for i in range(len(test)):
        if inst.touching(test[i][1]["instances"].numpy()):
            return i
    raise SystemExit("parted: no test canvas has touching items")


def numbered(masks: list[np.ndarray], shape) -> np.ndarray:
    """One map (H, W) uint8 of several boolean masks: 0 nowhere, k + 1 on the k-th."""
    out = np.zeros(shape, dtype=np.uint8)
    for k, mask in enumerate(masks):
        out[mask] = k + 1
    return out


def heat(w: np.ndarray, zoom: int):
    """The weight map as grey levels, its largest weight white, enlarged as draw_mask enlarges."""
    from PIL import Image

    grey = (255 * w / w.max()).round().astype(np.uint8) if w.max() > 0 else np.zeros(w.shape, np.uint8)
    return Image.fromarray(grey).convert("RGB").resize((w.shape[1] * zoom, w.shape[0] * zoom), Image.NEAREST)


def draw(folder: Path, out: Path, seed: int = 0, index: int | None = None) -> dict:
    """Draws the canvas's items, its weight map and each arm's parts into `out`; returns what was drawn:
    {"canvas": index, "true": (H, W) items, "weights": (H, W), arm: {"parts": (H, W), "matched": m}}."""
    runs = {arm: run for (arm, s), run in inst.finished_runs(folder).items() if s == seed}
    missing = [arm for arm in inst.ARMS if arm not in runs]
    if missing:
        raise SystemExit(f"parted: no finished run of {', '.join(missing)} seed {seed} in {folder}; run "
                         f"python -m common.sweep papers/unet/claims/weighted-loss.yaml first")
    import torch
    from PIL import Image

    from common.data import canvas
    from common.data.collate import IGNORE_INDEX
    from common.predict import draw_mask, run_model
    from papers.fcn.claims.masks import panel, save_side_by_side
    from papers.unet.weights import target_weights

    data_dir = json.loads((runs["paper"] / "config.json").read_text()).get("data_dir")
    test = canvas.load(data_dir)[1]
    index = first_touching(test) if index is None else index
    image, target = test[index]
    grey = Image.fromarray(test.maps[index]["pixels"].numpy())
    classes, items = target["labels"].numpy(), target["instances"].numpy()
    void = classes == IGNORE_INDEX
    truth = inst.true_items(items, void)
    drawn = {"canvas": index, "true": numbered(truth, items.shape), "weights": target_weights(target).numpy()}
    pictures = [panel(draw_mask(grey, drawn["true"], ["background"] + [f"item {k + 1}" for k in range(len(truth))]),
                      f"test canvas {index}: {len(truth)} items")]
    zoom = max(1, 400 // max(grey.size))
    pictures.append(panel(heat(drawn["weights"], zoom), f"eq. 2's weights (max {drawn['weights'].max():.1f})"))
    for arm in inst.ARMS:
        model, _ = run_model(runs[arm], "segmentation")
        with torch.no_grad():
            labels = model(image[None])[0].argmax(0).numpy()
        parts = inst.components(labels, void)
        m = inst.matched(parts, truth)
        drawn[arm] = {"parts": numbered(parts, items.shape), "matched": m}
        names = ["background"] + [f"part {k + 1}" for k in range(len(parts))]
        pictures.append(panel(draw_mask(grey, drawn[arm]["parts"], names),
                              f"{TITLES[arm]}, seed {seed}: {m} of {len(truth)} parted"))
    save_side_by_side(pictures, out)
    return drawn


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m papers.unet.claims.parted", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", default="runs", help="where common.sweep put the sweep's runs (runs)")
    parser.add_argument("--seed", type=int, default=0, help="whose runs are drawn (0)")
    parser.add_argument("--canvas", type=int, default=None,
                        help="which canvas of the test split (default: the first whose items touch)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the picture ({OUT.name} beside this file)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        drawn = draw(Path(args.runs_dir) / inst.SWEEP, args.out, args.seed, args.canvas)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    print(f"drew test canvas {drawn['canvas']} and seed {args.seed} of both arms into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
