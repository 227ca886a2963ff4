"""The results table of docs/fashion-mnist.md, computed: one row for each paper's default sweep,
`sweeps/fashion-mnist-<paper>.yaml` (the speedruns aside), from the runs of it in results/: the mean
test accuracy over its seeds with the standard deviation and the 95% interval (Student's t, as
`common.leaderboard --sweep` gives it), each seed's, the wall time and samples/s of a run, and the row
of the published table (Xiao et al.'s benchmark) it is set beside.

    python -m common.benchmark_table            # print the table
    python -m common.benchmark_table --write    # and write it between the page's markers

A sweep with fewer runs in results/ than its seeds says how many have landed; one with none says it is
not run yet. tests/test_benchmark_table.py fails when the page's table is not what --write writes.
"""

import argparse
import sys
from pathlib import Path

from common import seeds
from common.claims import replace_block, seed_count, write_block
from common.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
PAGE, BLOCK = "docs/fashion-mnist.md", "fashion-mnist:results"
SWEEPS = "fashion-mnist-"  # sweeps/fashion-mnist-<paper>.yaml

# paper: (its name, the published table's row it is set beside; "none" where the table has no row of its kind)
PAPERS = {
    "lenet": ("LeNet-5", "MLP 256-128-64 0.900"),
    "alexnet": ("AlexNet", "AlexNet with triplet loss 0.899"),
    "vgg": ("VGG", "VGG16 0.935"),
    "googlenet": ("GoogLeNet", "GoogleNet 0.937"),
    "resnet": ("ResNet", "ResNet18 0.949"),
    "resnext": ("ResNeXt", "none; beside ResNet"),
    "densenet": ("DenseNet", "DenseNet-BC 768K 0.954"),
    "mobilenetv2": ("MobileNetV2", "MobileNet 0.950"),
    "convnext": ("ConvNeXt", "none; beside ResNet"),
    "vit": ("ViT", "none; beside ResNet"),
    "deit": ("DeiT", "none; beside ViT and ResNet"),
    "swin": ("Swin", "none; beside ViT and ResNet"),
    "lstm": ("LSTM", "GRU+SVM 0.897"),
    "gru": ("GRU", "GRU+SVM 0.897"),
}
HEADER = ("| paper | test accuracy, 3 seeds | 95% interval | each seed | wall a run (mean) | samples/s (mean) "
          "| the table's row |\n|---|---|---|---|---|---|---|")


def sweep_files(root: Path = ROOT) -> list[Path]:
    """The papers' default sweeps, in PAPERS' order; a sweep of a paper PAPERS does not know is an error."""
    found = {p.stem.removeprefix(SWEEPS): p for p in (root / "sweeps").glob(SWEEPS + "*.yaml")}
    unknown = sorted(set(found) - set(PAPERS))
    if unknown:
        raise ConfigError(f"sweeps/{SWEEPS}{unknown[0]}.yaml: no row of the published table is named for "
                          f"'{unknown[0]}' in common/benchmark_table.py's PAPERS")
    return [found[p] for p in PAPERS if p in found]


def _thousands(x: float) -> str:
    return f"{x:,.0f}"


def row(paper: str, sweep: dict, runs: list[dict]) -> str:
    """One paper's row from its sweep file and its runs in results/ (any order)."""
    name, published = PAPERS[paper]
    planned = seed_count(sweep)
    runs = sorted(runs, key=lambda r: r["sweep"]["combination"].get("seed", 0))
    if not runs:
        return f"| {name} | not run yet (`sweeps/{SWEEPS}{paper}.yaml`) | | | | | {published} |"
    first = runs[0]
    title = f"{name} ({first.get('flavor') or 'default'}, {first['params']:,} parameters, {first['epochs']} epochs)"
    accuracy = [r["final"] for r in runs]
    s = seeds.summarize(accuracy)
    landed = "" if len(runs) >= planned else f" ({len(runs)} of {planned} seeds so far)"
    spread = f"{s.mean:.4f} ± {s.std:.4f}" if s.n > 1 else f"{s.mean:.4f}"
    interval = f"[{s.low:.4f}, {s.high:.4f}]" if s.n > 1 else "n/a"
    wall = [r["wall_s"] for r in runs]
    speed = [r["samples_per_s"] for r in runs]
    return (f"| {title} | {spread}{landed} | {interval} | {', '.join(f'{a:.4f}' for a in accuracy)} "
            f"| {_thousands(sum(wall) / len(wall))} s ({' / '.join(map(_thousands, wall))}) "
            f"| {_thousands(sum(speed) / len(speed))} ({' / '.join(map(_thousands, speed))}) | {published} |")


def table(results: list[dict], root: Path = ROOT) -> str:
    import yaml

    rows = [HEADER]
    for path in sweep_files(root):
        sweep = yaml.safe_load(path.read_text())
        runs = [r for r in results if (r.get("sweep") or {}).get("name") == sweep["name"]]
        rows.append(row(path.stem.removeprefix(SWEEPS), sweep, runs))
    return "\n".join(rows)


def stale(results: list[dict], root: Path = ROOT) -> bool:
    """Whether the page's table is not what --write would write today."""
    content = (root / PAGE).read_text()
    return content != replace_block(content, table(results, root), BLOCK, PAGE)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m common.benchmark_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--results-dir", type=Path, default=ROOT / "results", help="the local results store")
    p.add_argument("--write", action="store_true", help=f"write the table between {PAGE}'s markers")
    return p


def main(argv: list[str] | None = None) -> int:
    from common.leaderboard import local_results

    args = build_parser().parse_args(argv)
    try:
        text = table(local_results(args.results_dir))
        print(text)
        if args.write:
            write_block(PAGE, BLOCK, text)
    except (ConfigError, OSError) as e:
        print(f"benchmark_table: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
