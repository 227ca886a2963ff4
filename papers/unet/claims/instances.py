"""U-Net's touching items, counted: every run of the sweep unet-weighted-loss (weighted-loss.yaml beside this
file) segments each test canvas of fashion-canvas whole, and the items it parts are matched to the true ones.

    python -m papers.unet.claims.instances [--runs-dir runs]

Per canvas, the instance F1 at IoU 0.5:

- the predicted items are the connected components (8-connected: two items that meet at a corner are one)
  of the predicted foreground, any of the ten classes: the class is left out, so that two touching items
  count as two only where the net leaves background between them, as Figure 3 asks, whether their classes
  differ or not;
- the true items are the canvas's instance ids;
- the void band (labels 255, a pixel deep on each side of every outline) is left out of every IoU, as mean
  IoU leaves it out; a component that lies wholly on it is not counted. Every other component is, however
  small (no size threshold to tune);
- components and items are matched one to one (scipy's Hungarian matching on the IoUs) and a pair counts at
  IoU >= 0.5; F1 = 2 matched / (components + items).

The F1 of each run is the mean over the test canvases; `f1_touching` the same over the canvases where two
items touch (8-neighbours), the ones the weight map is for. Writes instances.json beside this file, the
commit it was measured at and the runs it read. A run of the sweep that has not finished is one line on
stderr, exit 2.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy import ndimage
from scipy.optimize import linear_sum_assignment

from common import seeds
from common.claims import provenance

HERE = Path(__file__).parent
SWEEP = "unet-weighted-loss"
ARMS = ("paper", "none")  # --pixel-weights
SEEDS = (0, 1, 2)
IOU = 0.5
EIGHT = np.ones((3, 3), dtype=bool)  # 8-connectivity


def components(labels: np.ndarray, void: np.ndarray) -> list[np.ndarray]:
    """The predicted items (H, W) bool: connected regions of the foreground (labels > 0), each with its
    pixels off the void band (one wholly on the band is dropped)."""
    regions, n = ndimage.label(labels > 0, structure=EIGHT)
    found = [(regions == k) & ~void for k in range(1, n + 1)]
    return [c for c in found if c.any()]


def true_items(instances: np.ndarray, void: np.ndarray) -> list[np.ndarray]:
    """The canvas's items (H, W) bool, each without its void band."""
    return [(instances == i) & ~void for i in np.unique(instances[instances > 0])]


def matched(predicted: list[np.ndarray], truth: list[np.ndarray]) -> int:
    """Pairs of a predicted and a true item at IoU >= 0.5, one to one."""
    if not predicted or not truth:
        return 0
    iou = np.array([[(p & t).sum() / (p | t).sum() for t in truth] for p in predicted])
    rows, cols = linear_sum_assignment(iou, maximize=True)
    return int((iou[rows, cols] >= IOU).sum())


def instance_f1(labels: np.ndarray, instances: np.ndarray, classes: np.ndarray) -> tuple[float, int, int, int]:
    """(F1, matched, predicted items, true items) of one canvas: its predicted classes (H, W), its instance
    ids and its true classes (for the void band)."""
    from common.data.collate import IGNORE_INDEX  # here, not at the top: it imports torch, which --help does not need

    void = classes == IGNORE_INDEX
    predicted, truth = components(labels, void), true_items(instances, void)
    m, total = matched(predicted, truth), len(predicted) + len(truth)
    return (2 * m / total if total else 1.0), m, len(predicted), len(truth)


def touching(instances: np.ndarray) -> bool:
    """Whether two items of a canvas are 8-neighbours somewhere."""
    padded = np.pad(instances, 1)  # 0: no item beyond the canvas
    H, W = instances.shape
    for dy, dx in ((0, 1), (1, 0), (1, 1), (1, -1)):  # each pair of neighbours once
        other = padded[1 + dy:1 + dy + H, 1 + dx:1 + dx + W]
        if ((instances > 0) & (other > 0) & (other != instances)).any():
            return True
    return False


def finished_runs(folder: Path) -> dict[tuple[str, int], Path]:
    """(pixel weights, seed): the finished run (config.json and model.safetensors) in the sweep's folder."""
    runs = {}
    for config in sorted(folder.glob("*/config.json")):
        cfg = json.loads(config.read_text())
        if (config.parent / "model.safetensors").is_file():
            runs[cfg["pixel_weights"], cfg["seed"]] = config.parent
    return runs


def run_id(run_dir: Path) -> str:
    result = run_dir / "result.json"
    return json.loads(result.read_text()).get("run_id", run_dir.name) if result.is_file() else run_dir.name


def evaluate(run_dir: Path, canvases: int | None) -> dict:
    """One run's mean instance F1 over the test canvases (the first `canvases`, or all), over those whose
    items touch, and its counts."""
    import torch

    from common.data import dataset_for, options
    from common.export import load_run_of

    model, cfg, _ = load_run_of(run_dir, "segmentation", "papers.unet.claims.instances")
    _, test = dataset_for(cfg).read(**options(cfg))
    scores, touch, counts = [], [], np.zeros(3, dtype=int)
    with torch.no_grad():
        for i in range(len(test) if canvases is None else min(canvases, len(test))):
            image, target = test[i]
            labels = model(image[None])[0].argmax(0).numpy()  # (H, W): the net on the whole canvas
            instances, classes = target["instances"].numpy(), target["labels"].numpy()
            f1, *n = instance_f1(labels, instances, classes)
            scores.append(f1)
            counts += n
            if touching(instances):
                touch.append(f1)
    return {"f1": float(np.mean(scores)), "f1_touching": float(np.mean(touch)) if touch else None,
            "canvases": len(scores), "touching_canvases": len(touch),
            **dict(zip(("matched", "predicted_items", "true_items"), map(int, counts)))}


def measure(folder: Path, canvases: int | None) -> dict:
    runs = finished_runs(folder)
    missing = [f"{arm} seed {s}" for arm in ARMS for s in SEEDS if (arm, s) not in runs]
    if missing:
        raise SystemExit(f"instances: no finished run of {', '.join(missing)} in {folder}; run python -m "
                         f"common.sweep papers/unet/claims/weighted-loss.yaml first")
    record = {"sweep": SWEEP, "runs": {}, "f1": {}, "f1_touching": {}, "counts": {}}
    for arm in ARMS:
        for s in SEEDS:
            m = evaluate(runs[arm, s], canvases)
            record["runs"].setdefault(arm, {})[str(s)] = run_id(runs[arm, s])
            record["f1"].setdefault(arm, {})[str(s)] = m.pop("f1")
            record["f1_touching"].setdefault(arm, {})[str(s)] = m.pop("f1_touching")
            record["counts"].setdefault(arm, {})[str(s)] = m
            print(f"{arm} seed {s}: F1 {record['f1'][arm][str(s)]:.4f}, {m}", file=sys.stderr)
    return record


def summary(record: dict) -> list[dict]:
    """Per arm and F1 (all canvases, touching ones): the mean over the seeds and its 95% interval."""
    rows = []
    for key in ("f1", "f1_touching"):
        for arm in ARMS:
            s = seeds.summarize([v for v in record[key][arm].values() if v is not None])
            rows.append({"f1": key, "arm": arm, "mean": s.mean, "std": s.std, "n": s.n, "low": s.low, "high": s.high})
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m papers.unet.claims.instances", description=__doc__.split("\n")[0])
    p.add_argument("--runs-dir", default="runs", type=Path, help="where common.sweep put the sweep's runs (runs)")
    p.add_argument("--canvases", type=int, default=None,
                   help="the first N test canvases only: a quick check, not the claim's numbers (default: all)")
    p.add_argument("--out", type=Path, default=HERE / "instances.json", help="the file written (instances.json "
                   "beside this script, which the hypothesis reads)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        record = measure(args.runs_dir / SWEEP, args.canvases)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    runs = [r for by_seed in record["runs"].values() for r in by_seed.values()]
    rows = summary(record)
    args.out.write_text(json.dumps({"provenance": provenance(runs)} | record | {"summary": rows}, indent=1) + "\n")
    print("| canvases | --pixel-weights | instance F1 | 95% interval |\n|---|---|---|---|")
    for r in rows:
        print(f"| {'all' if r['f1'] == 'f1' else 'items touching'} | {r['arm']} | {r['mean']:.4f} ± {r['std']:.4f} "
              f"(n {r['n']}) | [{r['low']:.4f}, {r['high']:.4f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
