"""Rank finished runs: one table per (task, dataset), best first; or a sweep's combinations over seeds.

    python -m common.leaderboard [--paper P] [--dataset D] [--best-only] [--format table|markdown|csv|json]
    python -m common.leaderboard --format markdown --best-only --write docs/leaderboard.md
    python -m common.leaderboard --format markdown --best-only --top 1 --write README.md
    python -m common.leaderboard --group-seeds [--paper P] [--dataset D]
    python -m common.leaderboard --sweep NAME [--metric M | --reach 'CURVE<=V'] [--versus PARAM]
    python -m common.leaderboard --sweep NAME --plot sweep.png [--curve train/error]
    python -m common.leaderboard --source wandb --project ENTITY/PROJECT
    python -m common.leaderboard --plot curves.png --runs RUN_ID ...
    python -m common.leaderboard --plot points.png --dataset D [--epochs N]
    python -m common.leaderboard --plot wall.png --wall-curves SWEEP ... --curve eval/accuracy

Results come from the local store (results/, one JSON file per finished run,
written by the trainer) or from a wandb project's finished runs, whose
summaries hold the same fields. The ranking tables leave out the runs of
sweeps (common.sweep), which are one experiment's parts: `--sweep NAME` shows
one sweep, a row per combination with the mean, standard deviation, n and 95%
interval over its seeds (common.seeds) (`--sweep A B`: two sweeps' runs together,
a claim's arms in two files), and `--include-sweeps` ranks them with the others. --write replaces only the lines between `<!-- leaderboard:start -->`
and `<!-- leaderboard:end -->` in a file (for a sweep, `<!-- leaderboard:NAME:start -->`
and `<!-- leaderboard:NAME:end -->`; for several, NAME is theirs joined by +).
"""

import argparse
import csv
import io
import json
import sys
from pathlib import Path

from common import seeds
from common.choices import BPE_VOCAB_SIZE
from common.config import describe_kwargs
from common.docs import replace_between
from common.errors import ConfigError
from common.tracking import find_result, local_results, short_commit

# Nothing above imports torch, so that --help and a mistyped flag are answered at once; the task kinds
# (common.tasks, with torch and torchmetrics) are imported where a ranking reads them.

START, END = "<!-- leaderboard:start -->", "<!-- leaderboard:end -->"
COLUMNS = ["rank", "paper", "flavor", "metric", "params", "strategy", "precision", "compile", "samples/s", "wall",
           "date", "commit", "run id"]


# ---------------------------------------------------------------- reading results


def wandb_results(project: str, api=None) -> list[dict]:
    """The finished runs of a wandb project, from their summaries (the trainer puts result.json there).

    Args:
        project: ENTITY/PROJECT.
        api: a wandb.Api-like object (tests pass a stand-in); default wandb.Api().
    """
    if api is None:
        import wandb

        api = wandb.Api()
    results = []
    for run in api.runs(project):
        summary = dict(run.summary)
        if run.state == "finished" and "final" in summary and "paper" in summary:
            results.append(summary | {"run_id": summary.get("run_id", run.name), "wandb_run_id": run.id,
                                      "config": dict(run.config)})
    return results


# ---------------------------------------------------------------- ranking


def higher_is_better(result: dict) -> bool:
    if "higher_is_better" in result:
        return result["higher_is_better"]
    from common.tasks import TASKS

    return TASKS[result["task"]].higher_is_better


def rank(results: list[dict], paper: str | None = None, dataset: str | None = None,
         best_only: bool = False, epochs: int | None = None,
         include_sweeps: bool = False) -> dict[tuple[str, str], list[dict]]:
    """{(task, dataset): results best first}; with best_only, each paper's best run; with epochs,
    only the runs of that many epochs (to compare papers trained alike); sweeps' runs only with
    include_sweeps; never a run evaluated on part of its test split (--eval-samples)."""
    tables: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        if (paper and r["paper"] != paper) or (dataset and r["dataset"] != dataset) or (
                epochs and r.get("epochs") != epochs) or (r.get("sweep") and not include_sweeps) or (
                (r.get("config") or {}).get("eval_samples")):  # evaluated on part of its test split
            continue
        tables.setdefault((r["task"], r["dataset"]), []).append(r)
    for key, rows in tables.items():
        rows.sort(key=lambda r: (-r["final"] if higher_is_better(r) else r["final"], r.get("finished_at", "")))
        if best_only:
            seen = set()  # a language model's runs per tokenizer: char and bpe compare in bits per character
            entry = lambda r: (r["paper"], tokenizer(r))
            rows[:] = [r for r in rows if not (entry(r) in seen or seen.add(entry(r)))]
    return dict(sorted(tables.items()))


def tokenizer(r: dict) -> str:
    """A language-modeling run's tokenizer ("bpe 1024"); "" for characters and for other tasks."""
    config = r.get("config") or {}
    if config.get("tokenizer", "char") == "char":
        return ""
    return f"{config['tokenizer']} {config.get('vocab_size') or BPE_VOCAB_SIZE}"


def flavor(r: dict) -> str:
    """The flavor, with what changed it: "tiny, activation=tanh", "tiny, bpe 1024", "tiny-classifier, LoRA r=4 q,v"."""
    config = r.get("config") or {}
    kwargs = describe_kwargs(config.get("model_kwargs") or {})
    lora = f"LoRA r={config['lora']} {config.get('lora_targets')}" if config.get("lora") else ""
    return ", ".join(filter(None, (r["flavor"], tokenizer(r), kwargs, lora)))


def cells(position: int, r: dict) -> dict[str, str]:
    from common.tasks import TASKS

    world = r.get("world_size", 1)
    return {
        "rank": str(position),
        "paper": r["paper"],
        "flavor": flavor(r),
        "metric": ", ".join([f"{r['metric']} {r['final']:.4g}"] + [
            f"{name.replace('_', ' ')} {r['final_metrics'][name]:.4g}" for name in getattr(TASKS.get(r["task"]), "beside", ())
            if name in r.get("final_metrics", {})]),
        "params": f"{r['params']:,}",
        "strategy": f"{r['strategy']} x{world}",
        "precision": r["precision"],
        "compile": "yes" if r.get("compile") else "no",
        "samples/s": f"{r['samples_per_s']:,.0f}",
        "wall": f"{r['wall_s']:.0f} s",
        "date": r.get("finished_at", "")[:10],
        "commit": short_commit(r),
        "run id": r["run_id"],
    }


# ---------------------------------------------------------------- output


def render(tables: dict, fmt: str, one_table: bool = False) -> str:
    """The ranking tables, one a data set; with one_table (--top 1), the best run of each data set as the rows of
    one table."""
    if fmt == "json":
        return json.dumps({f"{task} / {dataset}": rows for (task, dataset), rows in tables.items()}, indent=2)
    out = io.StringIO()
    if fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(["task", "dataset", *COLUMNS])
        for (task, dataset), rows in tables.items():
            for i, r in enumerate(rows, 1):
                writer.writerow([task, dataset, *cells(i, r).values()])
        return out.getvalue()
    if one_table and tables:
        table = [{"data set": f"**{dataset}**" if fmt == "markdown" else dataset, "task": task,
                  "better": "higher" if higher_is_better(r) else "lower"}
                 | {k: v for k, v in cells(1, r).items() if k != "rank"} for (task, dataset), (r, *_) in tables.items()]
        _write_table(out, table, fmt)
        return out.getvalue()
    for (task, dataset), rows in tables.items():
        better = "higher" if higher_is_better(rows[0]) else "lower"
        table = [cells(i, r) for i, r in enumerate(rows, 1)]
        name = f"**{dataset}**" if fmt == "markdown" else dataset
        out.write(f"{name} ({task}, {rows[0]['metric']}, {better} is better)\n" + "\n" * (fmt == "markdown"))
        _write_table(out, table, fmt)
        out.write("\n")
    return out.getvalue().rstrip("\n") + "\n"


def markers(name: str | None = None) -> tuple[str, str]:
    """The lines a section lies between: the leaderboard's, or a named one's (a sweep's)."""
    return (START, END) if name is None else (f"<!-- leaderboard:{name}:start -->", f"<!-- leaderboard:{name}:end -->")


def write_section(path: Path, text: str, name: str | None = None) -> None:
    """Replace what stands between the (named) leaderboard markers of a file."""
    path.write_text(replace_between(path.read_text(), *markers(name), text, path))


# ---------------------------------------------------------------- over seeds


def _number(x: float) -> str:
    return "n/a" if x != x else f"{x:.4g}"


def _spread(s: seeds.Summary) -> tuple[str, str]:
    """"mean ± std" and "[low, high]" of a summary (the mean alone, and "n/a", for one value)."""
    mean = _number(s.mean) if s.n < 2 else f"{_number(s.mean)} ± {s.std:.2g}"
    return mean, "n/a" if s.n < 2 else f"[{_number(s.low)}, {_number(s.high)}]"


def _write_table(out: io.StringIO, rows: list[dict[str, str]], fmt: str) -> None:
    columns = list(rows[0])
    if fmt == "markdown":  # a cell's own "|" (a regex in a combination, say) escaped, or it splits the cell
        cell = lambda text: text.replace("|", "\\|")
        out.write("| " + " | ".join(map(cell, columns)) + " |\n|" + "---|" * len(columns) + "\n")
        for c in rows:
            out.write("| " + " | ".join(map(cell, c.values())) + " |\n")
    else:
        widths = {k: max(len(k), *(len(c[k]) for c in rows)) for k in columns}
        out.write("  ".join(k.ljust(widths[k]) for k in columns).rstrip() + "\n")
        for c in rows:
            out.write("  ".join(c[k].ljust(widths[k]) for k in columns).rstrip() + "\n")


def group_seeds(tables: dict[tuple[str, str], list[dict]]) -> dict[tuple[str, str], list[list[dict]]]:
    """Each table's runs grouped by configuration (common.seeds.configuration: all but the seed and how
    they ran), the groups best first by their mean."""
    grouped = {}
    for key, rows in tables.items():
        groups: dict[str, list[dict]] = {}
        for r in rows:
            groups.setdefault(seeds.configuration(r), []).append(r)
        sign = -1 if higher_is_better(rows[0]) else 1
        grouped[key] = sorted(groups.values(), key=lambda g: sign * seeds.summarize([r["final"] for r in g]).mean)
    return grouped


def render_groups(grouped: dict[tuple[str, str], list[list[dict]]], fmt: str) -> str:
    """One row per configuration: the metric's mean ± std over its runs, n, and the 95% interval."""
    out = io.StringIO()
    for (task, dataset), groups in grouped.items():
        rows = []
        for i, g in enumerate(groups, 1):
            r, s = g[0], seeds.summarize([x["final"] for x in g])
            mean, interval = _spread(s)
            rows.append({"rank": str(i), "paper": r["paper"], "flavor": flavor(r), "metric": f"{r['metric']} {mean}",
                         "n": str(s.n), "95% interval": interval, "params": f"{r['params']:,}",
                         "samples/s": f"{sum(x['samples_per_s'] for x in g) / len(g):,.0f}",
                         "wall": f"{sum(x['wall_s'] for x in g) / len(g):.0f} s",
                         "commit": ", ".join(sorted({short_commit(x) for x in g}))})
        better = "higher" if higher_is_better(groups[0][0]) else "lower"
        title = f"{dataset} ({task}, {groups[0][0]['metric']}, {better} is better; mean ± std over seeds)"
        out.write(f"**{title}**\n\n" if fmt == "markdown" else f"{title}\n")
        _write_table(out, rows, fmt)
        out.write("\n")
    return out.getvalue().rstrip("\n") + "\n"


class Measure:
    """What number each run of a sweep gives: a final metric (--metric), a curve's last value, or the
    epochs it took to reach a target (--reach); and which way is better."""

    def __init__(self, metric: str | None = None, reach: str | None = None, unit: str = "epochs"):
        if metric and reach:
            raise ConfigError("--metric and --reach each name what a run is scored by; give one")
        self.metric, self.reach, self.unit = metric, seeds.parse_reach(reach) if reach else None, unit

    def label(self, r: dict) -> str:
        if self.reach:
            key, op, target = self.reach
            return f"{self.unit} to {key} {op} {target:g}"
        return self.metric or r["metric"]

    def lower_is_better(self, r: dict) -> bool:
        if self.reach:
            return True
        return not higher_is_better(r) if self.metric in (None, r["metric"]) else seeds.lower_is_better(self.metric)

    def __call__(self, r: dict) -> float | None:
        return seeds.reach(r, *self.reach, unit=self.unit) if self.reach else seeds.value(r, self.metric)


def sweep_runs(results: list[dict], name: str | list[str]) -> tuple[list[dict], dict]:
    """A sweep's runs (or those of several sweeps, one experiment's parts: a claim's arms in two files), and the
    parameters that have one value in all of them (shown once, not per row). Of several sweeps, a parameter
    that one of them sets to one value and the others leave out (VGG's deeper nets' --init) is shown once too,
    "(in that sweep only)", unless two arms would differ by it alone."""
    wanted = [name] if isinstance(name, str) else list(name)
    runs = [r for r in results if (r.get("sweep") or {}).get("name") in wanted]
    found = {r["sweep"]["name"] for r in runs}
    if missing := [n for n in wanted if n not in found]:
        names = sorted({r["sweep"]["name"] for r in results if r.get("sweep")})
        raise ConfigError(f"no runs of a sweep named '{missing[0]}' in the results; sweeps there: "
                          f"{', '.join(names) or 'none'}")
    params = [r["sweep"].get("combination", {}) for r in runs]
    fixed = {k: v for k, v in params[0].items() if k != "seed" and all(p.get(k, k) == v for p in params)}
    arms = lambda drop: len({json.dumps({k: v for k, v in p.items() if k not in drop and k != "seed"},
                                        sort_keys=True) for p in params})
    for k in dict.fromkeys(k for p in params for k in p if k not in fixed and k != "seed"):
        setting = [(r["sweep"]["name"], p[k]) for r, p in zip(runs, params) if k in p]
        if len({json.dumps(v) for _, v in setting}) == 1 and arms({*fixed, k}) == arms(set(fixed)):
            fixed[k] = f"{setting[0][1]} (in {', '.join(sorted({n for n, _ in setting}))} only)"
    return runs, fixed


def sweep_groups(results: list[dict], name: str | list[str], measure: Measure) -> list[tuple[dict, list[dict], list[float]]]:
    """(combination without the seed and the fixed parameters, its runs, their numbers) of a sweep, best
    first by the mean number."""
    runs, fixed = sweep_runs(results, name)
    groups: dict[str, tuple[dict, list[dict]]] = {}
    for r in runs:
        params = {k: v for k, v in seeds.combination(r).items() if k not in fixed}
        groups.setdefault(json.dumps(params, sort_keys=True), (params, []))[1].append(r)
    out = [(params, rs, [v for v in map(measure, rs) if v is not None]) for params, rs in groups.values()]
    sign = 1 if measure.lower_is_better(runs[0]) else -1
    return sorted(out, key=lambda g: (not g[2], sign * seeds.summarize(g[2]).mean if g[2] else 0))


def render_sweep(groups: list, measure: Measure, fmt: str) -> str:
    """One row per combination: the number's mean ± std over its seeds, n, the 95% interval (and with
    --reach, how many runs reached the target), the final metric beside another number, size and wall time."""
    first = groups[0][1][0]
    label, rows = measure.label(first), []
    for i, (params, runs, values) in enumerate(groups, 1):
        mean, interval = _spread(seeds.summarize(values)) if values else ("never", "n/a")
        row = {"rank": str(i), "combination": seeds.describe(params) or "-", label: mean, "n": str(len(values)),
               "95% interval": interval}
        if measure.reach:
            row["reached"] = f"{len(values)} of {len(runs)}"
        if label != first["metric"]:
            row[f"final {first['metric']}"] = _spread(seeds.summarize([r["final"] for r in runs]))[0]
        row |= {"params": f"{runs[0]['params']:,}", "wall": f"{sum(r['wall_s'] for r in runs) / len(runs):.0f} s"}
        rows.append(row)
    out = io.StringIO()
    _write_table(out, rows, fmt)
    return out.getvalue()


def versus(groups: list, param: str, measure: Measure, fmt: str) -> str:
    """For each value of one parameter, its best combination (the other parameters tuned for it, as a
    paper tunes each network's rate), best first, each against the next: the difference of their means
    and the ratio of their geometric means (the larger over the smaller number's way), with 95%
    intervals (Welch)."""
    best: dict[str, tuple] = {}
    for params, runs, values in groups:  # best first already: the first of each value is its best
        if param not in params:
            raise ConfigError(f"--versus {param}: the sweep's parameters are {', '.join(params) or 'only the seed'}")
        if values:
            best.setdefault(str(params[param]), (params, values))
    lower, label, rows = measure.lower_is_better(groups[0][1][0]), measure.label(groups[0][1][0]), []
    ranked = list(best.items())
    for i, (value, (params, values)) in enumerate(ranked):
        s = seeds.summarize(values)
        row = {param: value, "with": seeds.describe({k: v for k, v in params.items() if k != param}) or "-",
               label: f"{_spread(s)[0]} (n {s.n})", "against": "", "difference [95%]": "", "ratio [95%]": ""}
        if i + 1 < len(ranked):
            other = ranked[i + 1][1][1]
            d, lo, hi = seeds.welch(values, other)
            q = seeds.ratio(other, values) if lower else seeds.ratio(values, other)
            row |= {"against": ranked[i + 1][0], "difference [95%]": f"{d:+.4g} [{_number(lo)}, {_number(hi)}]",
                    "ratio [95%]": f"{q[0]:.3g} [{_number(q[1])}, {_number(q[2])}]" if q else "n/a"}
        rows.append(row)
    out = io.StringIO()
    _write_table(out, rows, fmt)
    return out.getvalue()


def arm_label(runs: list[dict], varying: dict, arms: list[tuple[str, dict, str]]) -> str | None:
    """The name a claim's hypothesis gives these runs' combination (the arm of their sweep whose parameters
    they all have, the most specific; two hypotheses' names for one arm joined by ' / '), with the varying
    parameters the arm leaves open; None where no hypothesis names it."""
    sweep = runs[0].get("sweep") or {}
    combination = sweep.get("combination") or {}
    fits = [(len(params), arm, params) for name, params, arm in arms if name == sweep.get("name")
            and all(str(combination.get(k)) == str(v) for k, v in params.items())]
    best = [fit for fit in fits if fit[0] == max(f[0] for f in fits)]
    if not best:
        return None
    arm = " / ".join(dict.fromkeys(arm for _, arm, _ in best))
    rest = seeds.describe({k: v for k, v in varying.items() if k not in best[0][2]})
    return f"{arm}, {rest}" if rest else arm


def plot_sweep(out: Path, name: str, groups: list, measure: Measure, curve: str,
               arms: list[tuple[str, dict, str]] = ()) -> None:
    """Left: each combination's number, its seeds as dots and the 95% interval of their mean; right: the
    curve `curve` of each combination against the epoch, the mean of its seeds with a band of one
    standard deviation (the runs' common steps). A combination is named by its claim's arm where `arms`
    (claims.arm_names()) has one, else by its parameters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    # drawn for the docs' column (about 800 px at the dpi below), its own file linked for the full size
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 0.4 * len(groups) + 3.2),
                                      gridspec_kw={"width_ratios": [1, 1.3]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    sweep_of = lambda runs: (runs[0].get("sweep") or {}).get("name")
    taken: dict[tuple, set] = {}  # (sweep, parameter): the values it takes among that sweep's combinations
    for params, runs, _ in groups:
        for k, v in params.items():
            taken.setdefault((sweep_of(runs), k), set()).add(str(v))

    def label_of(params: dict, runs: list[dict]) -> str:
        # an arm's name, with what varies within its own sweep beside it; else the parameters; a combination
        # that sets nothing (a claim's arm that is another sweep's defaults) is named by its sweep
        varying = {k: v for k, v in params.items() if len(taken[sweep_of(runs), k]) > 1}
        return arm_label(runs, varying, arms) or seeds.describe(params) or sweep_of(runs) or name

    for i, (params, runs, values) in enumerate(groups):
        color, label = colors[i % len(colors)], label_of(params, runs)
        y = len(groups) - 1 - i
        if values:
            s = seeds.summarize(values)
            left.scatter(values, [y] * len(values), s=14, color=color, alpha=0.5)
            left.errorbar([s.mean], [y], xerr=[[s.mean - s.low], [s.high - s.mean]] if s.n > 1 else None,
                          fmt="o", color=color, capsize=4)
        curves = [dict(seeds.series(r, curve)) for r in runs]
        steps = sorted(set.intersection(*(set(c) for c in curves))) if all(curves) else []
        if steps:
            per_epoch = runs[0].get("steps_per_epoch") or runs[0]["steps"] / runs[0]["epochs"]
            ys = np.array([[c[t] for t in steps] for c in curves])
            x, mean, std = np.array(steps) / per_epoch, ys.mean(0), ys.std(0, ddof=1) if len(ys) > 1 else 0 * ys[0]
            right.plot(x, mean, color=color, label=f"{label} (n {len(ys)})")
            right.fill_between(x, mean - std, mean + std, color=color, alpha=0.2)
    left.set_yticks(range(len(groups)), [label_of(g[0], g[1]) for g in reversed(groups)], fontsize=9)
    left.set(xlabel=f"{measure.label(groups[0][1][0])} (dots: seeds; bars: 95% interval)")
    left.grid(alpha=0.3)
    if measure.reach and measure.reach[0] == curve:
        right.axhline(measure.reach[2], color="gray", linestyle=":", linewidth=1)
    right.set(xlabel="epoch", ylabel=curve, title=f"{curve}: mean of the seeds, band one std")
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15))  # below: the curves stay in sight
    right.grid(alpha=0.3)
    fig.suptitle(f"sweep {name}")
    fig.tight_layout()
    fig.savefig(out, dpi=100, bbox_inches="tight")


def plot(out: Path, runs: list[str], results_dir: str | Path) -> None:
    """Training loss and test metric against the step, one line per run, from each run's metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_metric) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        result, run_dir = find_result(run, results_dir)
        if not (run_dir / "metrics.jsonl").is_file():
            raise ConfigError(f"run {run}: {run_dir}/metrics.jsonl is not there to draw from")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        metric = f"eval/{result['metric']}"
        losses = [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]
        evals = [(r["step"], r[metric]) for r in rows if metric in r]
        label = f"{result['run_id']} ({result['paper']} {result['flavor']})"
        ax_loss.plot(*zip(*losses), label=label)
        ax_metric.plot(*zip(*evals), marker="o", label=label)
        ax_metric.set_ylabel(f"test {result['metric']}")
    ax_loss.set(xlabel="step", ylabel="training loss", title="training loss")
    ax_metric.set(xlabel="step", title="test metric")
    ax_loss.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def wall_points(run: dict, curve: str) -> list[tuple[float, float]]:
    """A run's curve against wall time: each point's step at the run's mean rate (wall_s x step / steps), the
    result keeping no clock per point."""
    points = (run.get("curves") or {}).get(curve)
    if not points:
        raise ConfigError(f"run {run['run_id']} has no curve {curve}; its curves: {', '.join(run.get('curves') or {})}")
    return [(run["wall_s"] * step / run["steps"] / 60, value) for step, value in points]


def plot_wall(out: Path, results: list[dict], sweeps: list[str], curve: str) -> None:
    """--wall-curves: each sweep's curve against wall time in minutes, the mean over its seeds at each logged
    step (every run of one sweep logs at the same steps) at the mean of their wall times; the seeds' runs thin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    datasets: dict[str, None] = {}  # each sweep's data set, in order, for the title
    for i, name in enumerate(sweeps):
        runs, _ = sweep_runs(results, name)
        lines = [wall_points(r, curve) for r in runs]
        datasets[runs[0]["dataset"]] = None
        # Past the colour cycle's length, the same colours again with another line style and marker.
        color, (style, marker) = colors[i % len(colors)], [("-", "o"), ("--", "s"), (":", "^")][i // len(colors) % 3]
        for line in lines:
            ax.plot(*zip(*line), color=color, alpha=0.25, linewidth=0.8)
        n = min(len(line) for line in lines)
        mean = [(sum(line[j][0] for line in lines) / len(lines), sum(line[j][1] for line in lines) / len(lines))
                for j in range(n)]
        label = f"{runs[0]['paper']} {runs[0]['flavor']}: {mean[-1][1]:.4f} (mean of {len(runs)})"
        ax.plot(*zip(*mean), color=color, linestyle=style, marker=marker, markersize=3, label=label)
    ax.set(xlabel="wall time, minutes (each run's steps at its mean rate)", ylabel=curve,
           title=f"{curve} against wall time, {' and '.join(datasets)}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def scatter(out: Path, tables: dict[tuple[str, str], list[dict]]) -> None:
    """One table's runs as points: the metric against the parameter count, and against training samples/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(tables) != 1:
        raise ConfigError(f"--plot without --runs draws one table; these runs make {len(tables)}: "
                          "choose one with --dataset")
    (task, dataset), rows = next(iter(tables.items()))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, key, label in ((axes[0], "params", "parameters"), (axes[1], "samples_per_s", "training samples/s")):
        for r in rows:
            ax.scatter(r[key], r["final"], s=30)
            ax.annotate(f"{r['paper']} {r['flavor']}", (r[key], r["final"]), fontsize=7, xytext=(4, 3),
                        textcoords="offset points")
        ax.set(xscale="log", xlabel=f"{label} (log scale)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"test {rows[0]['metric']}")
    fig.suptitle(f"{dataset} ({task}): {len(rows)} runs")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m common.leaderboard", description="Rank finished runs.")
    p.add_argument("--source", choices=("local", "wandb"), default="local")
    p.add_argument("--results-dir", default="results", help="the local results store")
    p.add_argument("--project", help="ENTITY/PROJECT, with --source wandb")
    p.add_argument("--paper")
    p.add_argument("--dataset")
    p.add_argument("--best-only", action="store_true", help="each paper's best run")
    p.add_argument("--top", type=int, metavar="N", help="the first N rows of each table")
    p.add_argument("--epochs", type=int, help="only runs of this many epochs (papers trained alike)")
    p.add_argument("--include-sweeps", action="store_true", help="rank the runs of sweeps with the others")
    p.add_argument("--group-seeds", action="store_true",
                   help="one row per configuration: mean ± std over its seeds, n and the 95%% interval")
    p.add_argument("--sweep", metavar="NAME", nargs="+", help="one sweep's combinations, each over its seeds (or "
                   "several sweeps' together: a claim's arms in two files)")
    p.add_argument("--metric", help="with --sweep: score runs by another final metric (correct, map_50) or a "
                                    "curve's last value (train/epoch_accuracy; X/error is 1 - X/accuracy)")
    p.add_argument("--reach", metavar="CURVE<=VALUE",
                   help="with --sweep: score runs by the epochs they took to reach a target on a curve, e.g. "
                        "'train/error<=0.25' (or >=)")
    p.add_argument("--reach-in", choices=["epochs", "minutes"], default="epochs",
                   help="with --reach: count the epochs to the target (default) or the wall minutes, each run's steps "
                        "at its mean rate (a speedrun's clock)")
    p.add_argument("--versus", metavar="PARAM",
                   help="with --sweep: each value of PARAM at its best setting of the others, against the next, "
                        "with the difference and ratio and their 95%% intervals")
    p.add_argument("--where", metavar="PARAM=VALUE[,PARAM=VALUE]",
                   help="with --sweep: only the combinations with these values (a --versus at one setting of "
                        "the others, e.g. --versus paper --where train-fraction=0.1)")
    p.add_argument("--curve", default="train/loss", help="with --sweep --plot or --wall-curves: the curve drawn (default "
                                                     "train/loss)")
    p.add_argument("--format", choices=("table", "markdown", "csv", "json"), default="table")
    p.add_argument("--write", type=Path, help="replace the leaderboard section of this file (a sweep's own section "
                                              "with --sweep)")
    p.add_argument("--plot", type=Path,
                   help="draw into this image: with --runs, their loss and metric curves; with --sweep, the sweep; "
                        "else one table's runs as points, the metric against parameters and against training "
                        "samples/s")
    p.add_argument("--runs", nargs="+", default=[], help="run ids or run directories, with --plot")
    p.add_argument("--wall-curves", nargs="+", default=[], metavar="SWEEP",
                   help="with --plot: each sweep's --curve (e.g. eval/accuracy) against wall time, the mean over its "
                        "seeds")
    return p


def _pairs(text: str | None) -> list[tuple[str, str]]:
    """"a=1,b=x" -> [("a", "1"), ("b", "x")]."""
    pairs = [part.partition("=") for part in (text or "").split(",") if part]
    if any(not k or not eq for k, eq, _ in pairs):
        raise ConfigError(f"--where {text}: write PARAM=VALUE[,PARAM=VALUE]")
    return [(k.strip(), v.strip()) for k, _, v in pairs]


def where(groups: list, text: str | None) -> list:
    """The combinations whose parameters have the values --where names (compared as text)."""
    for key, value in _pairs(text):
        if not all(key in params for params, _, _ in groups):
            raise ConfigError(f"--where {key}: the sweep's parameters that vary are "
                              f"{', '.join(groups[0][0]) or 'only the seed'}")
        values = sorted({str(params[key]) for params, _, _ in groups})
        groups = [g for g in groups if str(g[0][key]) == value]
        if not groups:
            raise ConfigError(f"--where {key}={value}: no combination has it; its values are {', '.join(values)}")
        groups = [({k: v for k, v in params.items() if k != key}, runs, vals) for params, runs, vals in groups]
    return groups


def sweep_main(args, results: list[dict]) -> str | None:
    """--sweep NAME: its table (and --versus's), or with --plot its figure; returns the text to print or write."""
    if args.format in ("csv", "json"):
        raise ConfigError("--sweep writes a table or markdown")
    measure = Measure(args.metric, args.reach, args.reach_in)
    groups, name = where(sweep_groups(results, args.sweep, measure), args.where), " + ".join(args.sweep)
    if args.plot:
        from common import claims

        plot_sweep(args.plot, name, groups, measure, args.curve, claims.arm_names())
        return None
    fixed = seeds.describe(sweep_runs(results, args.sweep)[1] | dict(_pairs(args.where)))
    text = f"Sweep {name}: {fixed or 'no parameter fixed'}; over seeds.\n\n" + render_sweep(groups, measure, args.format)
    if args.versus:
        text += "\n" + versus(groups, args.versus, measure, args.format)
    return text


def main(argv: list[str] | None = None, api=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.runs and not args.plot:
            raise ConfigError("--runs goes with --plot FILE")
        if args.top is not None and args.top < 1:
            raise ConfigError(f"--top {args.top}: give the number of rows to keep, 1 or more")
        if (args.metric or args.reach or args.versus or args.where) and not args.sweep:
            raise ConfigError("--metric, --reach, --versus and --where score a sweep's runs: add --sweep NAME")
        if args.reach_in != "epochs" and not args.reach:
            raise ConfigError(f"--reach-in {args.reach_in} counts the time to a --reach target: add --reach CURVE>=VALUE")
        if args.wall_curves and not args.plot:
            raise ConfigError("--wall-curves goes with --plot FILE")
        if args.plot and args.runs:
            plot(args.plot, args.runs, args.results_dir)
            print(f"wrote {args.plot}")
            return 0
        if args.source == "wandb" and not args.project:
            raise ConfigError("--source wandb needs --project ENTITY/PROJECT")
        results = wandb_results(args.project, api) if args.source == "wandb" else local_results(args.results_dir)
        if args.wall_curves:
            plot_wall(args.plot, results, args.wall_curves, args.curve)
            text = None
        elif args.sweep:
            text = sweep_main(args, results)
        else:
            tables = rank(results, args.paper, args.dataset, args.best_only, args.epochs, args.include_sweeps)
            tables = {key: rows[:args.top] for key, rows in tables.items()} if args.top else tables
            if args.plot:
                scatter(args.plot, tables)
            text = None if args.plot else (render_groups(group_seeds(tables), args.format) if args.group_seeds
                                           else render(tables, args.format, one_table=args.top == 1))
        if text is None:
            print(f"wrote {args.plot}")
        elif args.write:
            name = "+".join(args.sweep) if args.sweep else None  # the section's markers: leaderboard:NAME:start
            write_section(args.write, text, name)
            print(f"wrote the {'sweep ' + name if name else 'leaderboard'} section of {args.write}")
        else:
            print(text, end="")
    except (ConfigError, ValueError) as e:
        print(f"leaderboard: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
