"""DETR against Faster R-CNN by object size: every run of the sweeps detr-object-size (object-size.yaml
beside this file) and faster_rcnn-proposals (papers/faster_rcnn/claims/proposals.yaml, evaluated as it
trained: 100 proposals) scored by COCO's AP for small, medium and large objects, with the two area
thresholds scaled to the digits' canvases so as to keep COCO's own proportions of objects: 41% small,
34% medium, 24% large (cocodataset.org, detection evaluation). The thresholds are the 41st and 75th
percentiles of the test split's box areas (`thresholds`), each moved to the half pixel above it so that
no box sits on one.

    python -m papers.detr.claims.object_size [--results-dir results] [--summary-only]

Prints, per size, each detector's mean AP over its seeds with the 95% interval and DETR minus Faster
R-CNN (Welch's interval), then the same for AP_small / AP_large (see `summary`), and writes every run's numbers to object-size.json and the figure to
object-size.png beside this file. Needs both sweeps' run directories (their weights).
"""

import argparse
import json
import math
import sys
from pathlib import Path

from common import seeds
from common.claims import provenance, saved_provenance
from common.evaluate import evaluate_run
from common.leaderboard import local_results, sweep_runs

HERE = Path(__file__).parent
SWEEPS = {"detr": "detr-object-size", "faster_rcnn": "faster_rcnn-proposals"}
FONTS = {"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 9}  # the figure is shown at its own size
COCO_SHARES = (0.41, 0.34, 0.24)  # COCO's objects: small, medium, large
SIZES = ("map_small", "map_medium", "map_large")


def thresholds() -> tuple[float, float]:
    """The test split's box areas at COCO's cumulative shares (41% and 75%), plus half a pixel."""
    import torch

    from common.data import get_dataset

    _, test = get_dataset("digits-detect").read()
    areas = torch.cat([(t["boxes"][:, 2] - t["boxes"][:, 0]) * (t["boxes"][:, 3] - t["boxes"][:, 1])
                       for _, t in (test[i] for i in range(len(test)))])
    cuts = torch.quantile(areas, torch.tensor([COCO_SHARES[0], COCO_SHARES[0] + COCO_SHARES[1]]))
    return tuple(math.floor(float(c)) + 0.5 for c in cuts)


def measure(results_dir: str, areas: tuple[float, float]) -> dict:
    results, record = local_results(results_dir), {}
    for paper, sweep in SWEEPS.items():
        runs, _ = sweep_runs(results, sweep)
        for r in sorted(runs, key=lambda r: r["config"]["seed"]):
            m = evaluate_run(Path(r["run_dir"]), areas=areas)
            record.setdefault(paper, {})[str(r["config"]["seed"])] = {
                "run_id": r["run_id"], **{k: m[k] for k in ("map", "map_50", *SIZES)}}
            print(f"{paper} seed {r['config']['seed']}: map {m['map']:.4f}, " +
                  ", ".join(f"{k} {m[k]:.4f}" for k in SIZES), file=sys.stderr)
    return record


def summary(record: dict) -> list[dict]:
    """Per AP (all, small, medium, large), each detector's mean and 95% interval and DETR minus Faster
    R-CNN (Welch). And, added after the first look at the results (the paper compares detectors of
    equal AP; here they are far apart), each run's AP_small / AP_large: how steeply its AP falls from
    large objects to small ones."""
    rows = []
    ratio = lambda run: run["map_small"] / run["map_large"]
    for key in ("map", *SIZES, "small/large"):
        d, f = ([ratio(run) if key == "small/large" else run[key] for run in record[p].values()]
                for p in ("detr", "faster_rcnn"))
        sd, sf, (diff, low, high) = seeds.summarize(d), seeds.summarize(f), seeds.welch(d, f)
        rows.append({"metric": key, "detr": sd.mean, "detr_low": sd.low, "detr_high": sd.high,
                     "faster_rcnn": sf.mean, "faster_rcnn_low": sf.low, "faster_rcnn_high": sf.high,
                     "difference": diff, "low": low, "high": high})
    return rows


def plot(rows: list[dict], record: dict, areas: tuple[float, float], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["metric"] != "small/large"]
    labels = ["all", f"small\n(< {areas[0]:g} px²)", "medium", f"large\n(> {areas[1]:g} px²)"]
    with plt.rc_context(FONTS):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for k, (paper, name) in enumerate((("detr", "DETR tiny"), ("faster_rcnn", "Faster R-CNN tiny"))):
            x = [i + (k - 0.5) * 0.3 for i in range(len(rows))]
            means = [r[paper] for r in rows]
            err = [[r[paper] - r[f"{paper}_low"] for r in rows], [r[f"{paper}_high"] - r[paper] for r in rows]]
            ax.bar(x, means, width=0.3, label=f"{name} ({len(record[paper])} seeds, 95% interval)", alpha=0.8)
            ax.errorbar(x, means, yerr=err, fmt="none", color="black", capsize=3)
            for i, row in enumerate(rows):
                ax.scatter([x[i]] * len(record[paper]), [run[row["metric"]] for run in record[paper].values()],
                           color="black", s=8, zorder=3)
        ax.set_xticks(range(len(rows)), labels)
        ax.set(ylabel="test AP (COCO, .5:.95)",
               title="By object size on digits-detect (areas at COCO's proportions)")
        ax.legend()
        ax.grid(alpha=0.3, axis="y")
        fig.tight_layout()
        fig.savefig(out, dpi=110)  # 770 px wide: the page shows it at its own size


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m papers.detr.claims.object_size",
                                description=__doc__.split("\n")[0])
    p.add_argument("--results-dir", default="results", help="where the sweeps' results are (their run_dir: the runs)")
    p.add_argument("--summary-only", action="store_true",
                   help="no evaluation: the table and figure again from object-size.json's numbers")
    return p


def run_ids(record: dict) -> list[str]:
    return [run["run_id"] for by_seed in record.values() for run in by_seed.values()]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.summary_only:  # the runs' numbers as the last full run wrote them
        saved = json.loads((HERE / "object-size.json").read_text())
        areas, record = tuple(saved["areas"]), saved["runs"]
        written = provenance(run_ids(record), saved_provenance(saved, run_ids(record)))
    else:
        areas = thresholds()
        record = measure(args.results_dir, areas)
        written = provenance(run_ids(record))
    rows = summary(record)
    (HERE / "object-size.json").write_text(json.dumps({"provenance": written, "areas": areas, "runs": record,
                                                       "summary": rows}, indent=1) + "\n")
    plot(rows, record, areas, HERE / "object-size.png")
    print(f"areas: small under {areas[0]:g} px², large over {areas[1]:g} px²")
    print("| AP | DETR tiny | Faster R-CNN tiny | DETR minus Faster R-CNN |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['metric']} | {r['detr']:.4f} [{r['detr_low']:.4f}, {r['detr_high']:.4f}] | "
              f"{r['faster_rcnn']:.4f} [{r['faster_rcnn_low']:.4f}, {r['faster_rcnn_high']:.4f}] | "
              f"{r['difference']:+.4f} [{r['low']:+.4f}, {r['high']:+.4f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
