"""DenseNet against ResNet, accuracy against parameters (Figure 3): the runs of the sweeps densenet-figure-3
and densenet-figure-3-resnet (figure-3.yaml and figure-3-resnet.yaml beside this file), or with
`--data fashion-mnist` those of figure-3-fashion-mnist.yaml and figure-3-fashion-mnist-resnet.yaml, read
from the results store; no run directory needed.

    python -m papers.densenet.claims.params_figure [--data fashion-mnist] [--results-dir results]

Prints each width's parameters and mean test accuracy with its 95% interval; then the pairs fixed in
figure-3.yaml before any run (each DenseNet against the ResNet with about twice its parameters: DenseNet
minus ResNet, Welch's interval); then, for each ResNet, the parameters a DenseNet needs for the ResNet's
mean accuracy (DenseNet's means joined by straight lines in log parameters) as a fraction of the ResNet's,
with a bootstrap interval over the seeds (each width's seeds drawn again with replacement, 2,000 times: a
rough interval with three seeds, said so in the note). Writes every run's number to figure-3.json and the
figure to figure-3.png beside this file (figure-3-fashion-mnist.json and .png with --data fashion-mnist).
"""

import argparse
import json
import math
import random
import sys
from pathlib import Path

from common import seeds
from common.claims import provenance
from common.errors import ConfigError
from common.leaderboard import local_results, sweep_runs

HERE = Path(__file__).parent
DATA = {"shapes": ("", "the shapes"), "fashion-mnist": ("-fashion-mnist", "Fashion-MNIST")}  # sweep suffix, title
NAMES = {"densenet": "DenseNet-BC-22", "resnet": "ResNet-20"}
DRAWS = 2000
FONTS = {"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 9}  # the figure is shown at its own size


def sweeps(data: str = "shapes") -> dict[str, str]:
    """{model: its sweep's name} on this data."""
    suffix = DATA[data][0]
    return {"densenet": f"densenet-figure-3{suffix}", "resnet": f"densenet-figure-3{suffix}-resnet"}


def measure(results: list[dict], data: str = "shapes") -> dict:
    """{model: [{setting, params, accuracies, run_ids}], by parameters} of both sweeps' runs."""
    record = {}
    for model, sweep in sweeps(data).items():
        runs, _ = sweep_runs(results, sweep)
        widths = {}
        for r in sorted(runs, key=lambda r: r["config"]["seed"]):
            setting = seeds.describe(r["config"]["model_kwargs"])
            w = widths.setdefault(setting, {"setting": setting, "params": r["params"], "accuracies": [], "run_ids": []})
            w["accuracies"].append(r["final"])
            w["run_ids"].append(r["run_id"])
        record[model] = sorted(widths.values(), key=lambda w: w["params"])
    return record


def params_for(accuracy: float, curve: list[tuple[int, float]]) -> float | None:
    """The parameters at which a curve of (parameters, accuracy) points, joined by straight lines in log
    parameters, first reaches `accuracy`; None where it never does or lies above it throughout."""
    for (p0, a0), (p1, a1) in zip(curve, curve[1:]):
        if min(a0, a1) <= accuracy <= max(a0, a1) and a0 != a1:
            t = (accuracy - a0) / (a1 - a0)
            return math.exp(math.log(p0) + t * (math.log(p1) - math.log(p0)))
    return None


def fractions(record: dict, accuracies: dict | None = None) -> list[float | None]:
    """For each ResNet (by parameters), the DenseNet's parameters at its mean accuracy over its own."""
    accuracies = accuracies or {m: [w["accuracies"] for w in record[m]] for m in record}
    mean = lambda xs: sum(xs) / len(xs)
    curve = [(w["params"], mean(a)) for w, a in zip(record["densenet"], accuracies["densenet"])]
    out = []
    for w, a in zip(record["resnet"], accuracies["resnet"]):
        p = params_for(mean(a), curve)
        out.append(None if p is None else p / w["params"])
    return out


def summary(record: dict) -> dict:
    widths = [{"model": m, "setting": w["setting"], "params": w["params"], "runs": len(w["accuracies"]),
               **dict(zip(("mean", "std", "n", "low", "high"), seeds.summarize(w["accuracies"])))}
              for m in record for w in record[m]]
    pairs = []
    for d, r in zip(record["densenet"], record["resnet"]):
        diff, low, high = seeds.welch(d["accuracies"], r["accuracies"])
        pairs.append({"densenet": d["setting"], "resnet": r["setting"], "params_ratio": r["params"] / d["params"],
                      "difference": diff, "low": low, "high": high})
    rng, drawn = random.Random(0), []
    for _ in range(DRAWS):
        again = {m: [rng.choices(w["accuracies"], k=len(w["accuracies"])) for w in record[m]] for m in record}
        drawn.append(fractions(record, again))
    ratios = []
    for i, (w, f) in enumerate(zip(record["resnet"], fractions(record))):
        found = sorted(d[i] for d in drawn if d[i] is not None)
        ratios.append({"resnet": w["setting"], "fraction": f, "drawn_in_range": len(found) / DRAWS,
                       "low": found[int(0.025 * len(found))] if found else None,
                       "high": found[int(0.975 * len(found)) - 1] if found else None})
    return {"widths": widths, "pairs": pairs, "fractions": ratios}


def plot(record: dict, out: Path, data: str = "shapes") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.rc_context(FONTS):
        fig, ax = plt.subplots(figsize=(7, 4.8))
        for model, widths in record.items():
            params = [w["params"] for w in widths]
            stats = [seeds.summarize(w["accuracies"]) for w in widths]
            line = ax.errorbar(params, [s.mean for s in stats], marker="o", capsize=3,
                               yerr=[[s.mean - s.low for s in stats], [s.high - s.mean for s in stats]],
                               label=f"{NAMES[model]} ({', '.join(w['setting'] for w in widths)}; 95% interval)")
            for w in widths:
                ax.scatter([w["params"]] * len(w["accuracies"]), w["accuracies"], s=8, color=line[0].get_color(),
                           alpha=0.6)
        ax.set_xscale("log")
        ax.set(xlabel="parameters", ylabel="test accuracy",
               title=f"Accuracy against parameters on {DATA[data][1]} (3 epochs)")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15))  # below: it hid the last point
        ax.grid(alpha=0.3, which="both")
        fig.tight_layout()
        fig.savefig(out, dpi=110)  # 770 px wide: the page shows it at its own size


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m papers.densenet.claims.params_figure",
                                description=__doc__.split("\n")[0])
    p.add_argument("--results-dir", default="results", help="the results store holding both sweeps' runs")
    p.add_argument("--data", choices=sorted(DATA), default="shapes", help="whose sweeps: the shapes' or Fashion-MNIST's")
    p.add_argument("--out", default=str(HERE), help="where figure-3[-fashion-mnist].json and .png go")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        record = measure(local_results(args.results_dir), args.data)
    except ConfigError as e:
        print(f"params_figure: error: {e}", file=sys.stderr)
        return 2
    result = summary(record)
    out, stem = Path(args.out), "figure-3" + DATA[args.data][0]
    written = provenance(i for widths in record.values() for w in widths for i in w["run_ids"])
    (out / f"{stem}.json").write_text(json.dumps({"provenance": written, "runs": record, **result}, indent=1) + "\n")
    plot(record, out / f"{stem}.png", args.data)
    print("| net | width | parameters | test accuracy (95% interval) |\n|---|---|---|---|")
    for w in result["widths"]:
        print(f"| {NAMES[w['model']]} | {w['setting']} | {w['params']:,} | {w['mean']:.3f} [{w['low']:.3f}, "
              f"{w['high']:.3f}] ({w['runs']} seeds) |")
    print("\n| DenseNet | ResNet | ResNet's parameters / DenseNet's | DenseNet minus ResNet |\n|---|---|---|---|")
    for q in result["pairs"]:
        print(f"| {q['densenet']} | {q['resnet']} | {q['params_ratio']:.2f} | {q['difference']:+.3f} "
              f"[{q['low']:+.3f}, {q['high']:+.3f}] |")
    print("\n| ResNet | DenseNet's parameters for its accuracy, as a fraction of its own |\n|---|---|")
    for f in result["fractions"]:
        at = "outside DenseNet's range" if f["fraction"] is None else f"{f['fraction']:.2f}"
        spread = (f"[{f['low']:.2f}, {f['high']:.2f}] over the {f['drawn_in_range']:.0%} of draws in range"
                  if f["low"] is not None else "no draw in range")
        print(f"| {f['resnet']} | {at} {spread} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
