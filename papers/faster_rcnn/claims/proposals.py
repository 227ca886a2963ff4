"""Faster R-CNN's proposals at test time: each run of the sweep faster_rcnn-proposals (proposals.yaml
beside this file) evaluated with N of the RPN's proposals kept after NMS, for every N in NS, on the same
trained weights (`common.evaluate.evaluate_run` with rpn_post_nms_top_n=(150, N); training unchanged).

    python -m papers.faster_rcnn.claims.proposals [--results-dir results]

Prints, per N, the mean mAP over the seeds with its 95% interval and the paired difference to the
flavor's own 100 (per seed, the same weights: a paired interval), and writes every run's numbers to
proposals.json and the figure to proposals.png beside this file. Needs the sweep's run directories
(runs/faster_rcnn-proposals/), which hold the weights.
"""

import argparse
import json
import sys
from pathlib import Path

from common import seeds
from common.claims import provenance, saved_provenance
from common.evaluate import evaluate_run
from common.leaderboard import local_results, sweep_runs

HERE = Path(__file__).parent
SWEEP = "faster_rcnn-proposals"
NS = (1, 3, 10, 30, 100, 300)  # proposals after NMS at test time; 300 is all the 300 before NMS can keep
FONTS = {"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 9}  # the figure is shown at its own size
DEFAULT = 100  # the tiny flavor's own number at test time
TRAINING = 150  # the tiny flavor's number in training (unused at test; the tuple needs it)


def measure(results_dir: str) -> dict:
    runs, _ = sweep_runs(local_results(results_dir), SWEEP)
    table = {}
    for r in sorted(runs, key=lambda r: r["config"]["seed"]):
        seed = r["config"]["seed"]
        for n in NS:
            m = evaluate_run(Path(r["run_dir"]), model_kwargs={"rpn_post_nms_top_n": [TRAINING, n]})
            table.setdefault(str(seed), {})[str(n)] = {k: m[k] for k in ("map", "map_50", "mar_100")}
            print(f"seed {seed}, {n} proposals: map {m['map']:.4f}", file=sys.stderr)
    return {"sweep": SWEEP, "runs": {str(r["config"]["seed"]): r["run_id"] for r in runs}, "map": table}


def summary(record: dict) -> list[dict]:
    """Per N: mAP's mean, 95% interval and the paired difference to DEFAULT with its interval."""
    table, rows = record["map"], []
    for n in NS:
        values = [table[s][str(n)]["map"] for s in table]
        diffs = [table[s][str(n)]["map"] - table[s][str(DEFAULT)]["map"] for s in table]
        m, d = seeds.summarize(values), seeds.summarize(diffs)
        rows.append({"proposals": n, "map": m.mean, "std": m.std, "n": m.n, "low": m.low, "high": m.high,
                     "minus_default": d.mean, "minus_low": d.low, "minus_high": d.high})
    return rows


def plot(rows: list[dict], record: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.rc_context(FONTS):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for s, by_n in record["map"].items():
            ax.plot(NS, [by_n[str(n)]["map"] for n in NS], color="gray", alpha=0.4, marker=".", linewidth=1)
        means = [r["map"] for r in rows]
        ax.errorbar(NS, means, yerr=[[r["map"] - r["low"] for r in rows], [r["high"] - r["map"] for r in rows]],
                    marker="o", capsize=4, label=f"mean of {rows[0]['n']} seeds, 95% interval (gray: each seed)")
        ax.set(xscale="log", xlabel="RPN proposals kept after NMS at test time", ylabel="test mAP (COCO, .5:.95)",
               title="Faster R-CNN tiny on digits-detect: the same weights, N proposals")
        ax.set_xticks(NS, [str(n) for n in NS])
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out, dpi=110)  # 770 px wide: the page shows it at its own size


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m papers.faster_rcnn.claims.proposals",
                                description=__doc__.split("\n")[0])
    p.add_argument("--results-dir", default="results", help="where the sweep's results are (their run_dir: the runs)")
    p.add_argument("--summary-only", action="store_true",
                   help="no evaluation: the table and figure again from proposals.json's numbers")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.summary_only:  # the runs' numbers as the last full run wrote them
        saved = json.loads((HERE / "proposals.json").read_text())
        record = {k: saved[k] for k in ("sweep", "runs", "map")}
        written = provenance(record["runs"].values(), saved_provenance(saved, record["runs"].values()))
    else:
        record = measure(args.results_dir)
        written = provenance(record["runs"].values())
    rows = summary(record)
    (HERE / "proposals.json").write_text(json.dumps({"provenance": written} | record | {"summary": rows},
                                                    indent=1) + "\n")
    plot(rows, record, HERE / "proposals.png")
    print(f"| proposals | mAP | 95% interval | minus {DEFAULT} proposals (paired) |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['proposals']} | {r['map']:.4f} ± {r['std']:.4f} | [{r['low']:.4f}, {r['high']:.4f}] | "
              f"{r['minus_default']:+.4f} [{r['minus_low']:+.4f}, {r['minus_high']:+.4f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
