"""Rank finished runs: one table per (task, dataset), best first.

    python -m common.leaderboard [--paper P] [--dataset D] [--best-only] [--format table|markdown|csv|json]
    python -m common.leaderboard --format markdown --best-only --write README.md
    python -m common.leaderboard --source wandb --project ENTITY/PROJECT
    python -m common.leaderboard --plot curves.png --runs RUN_ID ...
    python -m common.leaderboard --plot points.png --dataset D [--epochs N]

Results come from the local store (results/, one JSON file per finished run,
written by the trainer) or from a wandb project's finished runs, whose
summaries hold the same fields. --write replaces only the lines between
`<!-- leaderboard:start -->` and `<!-- leaderboard:end -->` in a file.
"""

import argparse
import csv
import io
import json
import sys
from pathlib import Path

from common.data.text import BPE_VOCAB_SIZE
from common.errors import ConfigError
from common.tasks import TASKS

START, END = "<!-- leaderboard:start -->", "<!-- leaderboard:end -->"
COLUMNS = ["rank", "paper", "flavor", "metric", "params", "strategy", "precision", "compile", "samples/s", "wall",
           "date", "commit", "run id"]


# ---------------------------------------------------------------- reading results


def local_results(results_dir: str | Path) -> list[dict]:
    """Every result in the store; an interrupted run never wrote one."""
    folder = Path(results_dir)
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


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


def find_result(run: str, results_dir: str | Path) -> tuple[dict, Path]:
    """(result, run directory) of a finished run, by its run id (in the store) or its run directory."""
    path = Path(run)
    if (path / "result.json").is_file():
        return json.loads((path / "result.json").read_text()), path
    entry = Path(results_dir) / f"{run}.json"
    if entry.is_file():
        result = json.loads(entry.read_text())
        return result, Path(result["run_dir"])
    raise ConfigError(f"no finished run '{run}': neither a run directory with result.json nor an entry in "
                      f"{results_dir}/ (see python -m common.leaderboard)")


# ---------------------------------------------------------------- ranking


def higher_is_better(result: dict) -> bool:
    return result.get("higher_is_better", TASKS[result["task"]].higher_is_better)


def rank(results: list[dict], paper: str | None = None, dataset: str | None = None,
         best_only: bool = False, epochs: int | None = None) -> dict[tuple[str, str], list[dict]]:
    """{(task, dataset): results best first}; with best_only, each paper's best run; with epochs,
    only the runs of that many epochs (to compare papers trained alike)."""
    tables: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        if (paper and r["paper"] != paper) or (dataset and r["dataset"] != dataset) or (
                epochs and r.get("epochs") != epochs):
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


def cells(position: int, r: dict) -> dict[str, str]:
    world = r.get("world_size", 1)
    return {
        "rank": str(position),
        "paper": r["paper"],
        "flavor": ", ".join(filter(None, (r["flavor"], tokenizer(r)))),
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
        "commit": (r.get("commit") or "")[:7],
        "run id": r["run_id"],
    }


# ---------------------------------------------------------------- output


def render(tables: dict, fmt: str) -> str:
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
    for (task, dataset), rows in tables.items():
        better = "higher" if higher_is_better(rows[0]) else "lower"
        table = [cells(i, r) for i, r in enumerate(rows, 1)]
        if fmt == "markdown":
            out.write(f"**{dataset}** ({task}, {rows[0]['metric']}, {better} is better)\n\n")
            out.write("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n")
            for c in table:
                out.write("| " + " | ".join(c.values()) + " |\n")
        else:
            out.write(f"{dataset} ({task}, {rows[0]['metric']}, {better} is better)\n")
            widths = {k: max(len(k), *(len(c[k]) for c in table)) for k in COLUMNS}
            out.write("  ".join(k.ljust(widths[k]) for k in COLUMNS) + "\n")
            for c in table:
                out.write("  ".join(c[k].ljust(widths[k]) for k in COLUMNS) + "\n")
        out.write("\n")
    return out.getvalue().rstrip("\n") + "\n"


def write_section(path: Path, text: str) -> None:
    """Replace what stands between the leaderboard markers of a file; the rest is kept byte for byte."""
    content = path.read_text()
    if content.count(START) != 1 or content.count(END) != 1 or content.index(START) > content.index(END):
        raise ConfigError(f"{path} needs one '{START}' line and, after it, one '{END}' line")
    head, rest = content.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{START}\n{text.rstrip()}\n{END}{tail}")


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


def main(argv: list[str] | None = None, api=None) -> int:
    p = argparse.ArgumentParser(prog="python -m common.leaderboard", description="Rank finished runs.")
    p.add_argument("--source", choices=("local", "wandb"), default="local")
    p.add_argument("--results-dir", default="results", help="the local results store")
    p.add_argument("--project", help="ENTITY/PROJECT, with --source wandb")
    p.add_argument("--paper")
    p.add_argument("--dataset")
    p.add_argument("--best-only", action="store_true", help="each paper's best run")
    p.add_argument("--epochs", type=int, help="only runs of this many epochs (papers trained alike)")
    p.add_argument("--format", choices=("table", "markdown", "csv", "json"), default="table")
    p.add_argument("--write", type=Path, help="replace the leaderboard section of this file")
    p.add_argument("--plot", type=Path,
                   help="draw into this image: with --runs, their loss and metric curves; without, one table's "
                        "runs as points, the metric against parameters and against training samples/s")
    p.add_argument("--runs", nargs="+", default=[], help="run ids or run directories, with --plot")
    args = p.parse_args(argv)
    try:
        if args.runs and not args.plot:
            raise ConfigError("--runs goes with --plot FILE")
        if args.plot and args.runs:
            plot(args.plot, args.runs, args.results_dir)
            print(f"wrote {args.plot}")
            return 0
        if args.source == "wandb" and not args.project:
            raise ConfigError("--source wandb needs --project ENTITY/PROJECT")
        results = wandb_results(args.project, api) if args.source == "wandb" else local_results(args.results_dir)
        tables = rank(results, args.paper, args.dataset, args.best_only, args.epochs)
        if args.plot:
            scatter(args.plot, tables)
            print(f"wrote {args.plot}")
            return 0
        text = render(tables, args.format)
        if args.write:
            write_section(args.write, text)
            print(f"wrote the leaderboard section of {args.write}")
        else:
            print(text, end="")
    except ConfigError as e:
        print(f"leaderboard: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
