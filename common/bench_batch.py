"""Batch size against time to a good model: `python -m common.bench --rows batch`.

    python -m common.bench --rows batch --papers resnet,vit --target 0.95 --plot docs/batch-digits.png

For each paper on its default data set, training runs (one process, the paper's default recipe and
epochs) at batch sizes from 16 doubling up to four times what `--batch-size auto` picks, each with
the learning rate scaled from the paper's batch (`--lr-scaling linear`, Goyal et al.'s warmup when it
grows). Reported per batch: optimizer steps per epoch, the learning rate in use, training samples/s
(how much faster a bigger batch goes per sample), the final test metric, and the wall time until the
first evaluation at or past the target (whether it still gets there sooner). Batches above auto's pick
leave fewer than MIN_STEPS_PER_EPOCH steps an epoch: they show what its floor avoids. A table
(markdown) and a plot (PNG, matplotlib).
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common.batchsize import MIN_STEPS_PER_EPOCH

ROOT = Path(__file__).resolve().parent.parent
SMALLEST = 16
BEYOND_AUTO = 4  # the largest batch tried, in multiples of auto's pick


def run(flags: list[str]) -> tuple[dict, list[dict]]:
    """A training run in its own process: (result.json, its evaluations from metrics.jsonl)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, str(ROOT / "train.py"), *flags, "--wandb", "disabled", "--out", f"{tmp}/run",
                        "--results-dir", f"{tmp}/results"], check=True, capture_output=True, cwd=tmp)
        result = json.loads(Path(f"{tmp}/run/result.json").read_text())
        lines = Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines()
        return result, [r for r in map(json.loads, lines) if "epoch" in r]


def time_to(evaluations: list[dict], metric: str, target: float, higher_is_better: bool) -> tuple[float, int] | None:
    """(wall seconds from the start, epoch) of the first evaluation at or past the target; None if none got there."""
    for e in evaluations:
        value = e[f"eval/{metric}"]
        if (value >= target) if higher_is_better else (value <= target):
            return e["time/wall_s"], e["epoch"]
    return None


def measure(paper: str, target: float) -> list[dict]:
    """One row per batch size for a paper (see the module's docstring)."""
    auto, _ = run(["--paper", paper, "--batch-size", "auto", "--epochs", "1", "--lr-scaling", "none"])
    sizes, b = [], SMALLEST
    while b <= BEYOND_AUTO * auto["batch_size"]:
        sizes.append(b)
        b *= 2
    rows = []
    for batch in sizes:
        result, evaluations = run(["--paper", paper, "--batch-size", str(batch)])
        rows.append(dict(paper=paper, dataset=result["dataset"], batch=batch, auto=batch == auto["batch_size"],
                         steps_per_epoch=result["steps"] // result["epochs"], lr=result["lr"],
                         warmup=result["warmup_steps"], samples_per_s=result["samples_per_s"],
                         metric=result["metric"], final=result["final"], wall_s=result["wall_s"],
                         to_target=time_to(evaluations, result["metric"], target, result["higher_is_better"])))
    return rows


def markdown(rows: list[dict], target: float) -> str:
    lines = [f"| paper | batch | steps/epoch | lr | warmup | samples/s | final | s to {target:g} | run s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = " (auto)" if r["auto"] else (" (< floor)" if r["steps_per_epoch"] < MIN_STEPS_PER_EPOCH else "")
        reached = f"{r['to_target'][0]:.1f} (epoch {r['to_target'][1]})" if r["to_target"] else "not reached"
        lines.append(f"| {r['paper']} | {r['batch']}{mark} | {r['steps_per_epoch']} | {r['lr']:.3g} | {r['warmup']} | "
                     f"{r['samples_per_s']:,.0f} | {r['metric']} {r['final']:.4g} | {reached} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def plot(rows: list[dict], target: float, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, reach) = plt.subplots(1, 2, figsize=(10, 4))
    for paper in dict.fromkeys(r["paper"] for r in rows):
        mine = [r for r in rows if r["paper"] == paper]
        line, = speed.plot([r["batch"] for r in mine], [r["samples_per_s"] for r in mine], "o-", label=paper)
        got = [r for r in mine if r["to_target"] is not None]
        reach.plot([r["batch"] for r in got], [r["to_target"][0] for r in got], "o-", color=line.get_color(),
                   label=paper)
        for r in mine:
            if r["auto"]:
                for ax in (speed, reach):
                    ax.axvline(r["batch"], color=line.get_color(), ls=":", lw=1)
    for ax, title in ((speed, "training samples/s"), (reach, f"wall seconds to test {rows[0]['metric']} >= {target:g}")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size (dotted: auto's pick)")
        ax.set_title(title)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"batch size on {rows[0]['dataset']}, learning rate scaled linearly from the paper's batch")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def report(papers: list[str], target: float, plot_path: str | None) -> str:
    rows = [r for paper in papers for r in measure(paper, target)]
    text = markdown(rows, target)
    if plot_path:
        text += f"\n\nplot: {plot(rows, target, Path(plot_path))}"
    return text
