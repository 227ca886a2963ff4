"""Speed comparisons, each a ratio of two things measured side by side in one process.

    python -m common.bench [--rows a,b,c,d,e,f,g] [--papers vit,resnet,lstm | all] [--repeats 5] [--quick | --smoke]
    python -m common.bench --rows batch [--papers resnet,vit] [--target 0.95] [--plot PNG]
    python -m common.bench --rows i [--papers vit,resnet]

Each row times A and B alternately (A, B, A, B, ...) after a warm-up, and reports
the median of the per-repeat ratios, so that a noisy machine slows both alike.
Rows:
    a  the trainer against a bare PyTorch loop (same model, data, batch, optimizer), in one process and in
       2-process DDP: samples/s; outside --quick also the trainer with each per-step feature switched off
       (common.bench_loop)
    b  our models against timm, torchvision and transformers at the same configuration: forward+backward time
    c  our LSTM against torch.nn.LSTM, eager and compiled: forward+backward time
    d  compiled against eager training, each paper's tiny flavor and a larger one: samples/s
    e  bf16 autocast against fp32 training on this device: samples/s
    f  ddp on 2 processes against 1 process at the same global batch, and fsdp against ddp
    g  inference latency at batch 1 and 32: compiled, and onnxruntime on the CPU, against eager
    h  (not in the default rows) per rank, the bytes of parameters, gradients, AdamW's state and saved
       activations, and the step time against ddp's, of each layout of 4 processes (ddp, fsdp, tp x dp,
       fsdp x tp, hsdp, pp x dp by GPipe and by 1F1B), with and without --ac full: GPT-2-124M at 256
       positions and ViT-B/16
    i  (not in the default rows) samples/s of the trainer's loader with 0, 1 and 2 workers for an image
       folder, WebDataset shards and a Hugging Face dataset of the same images, against each image
       paper's training samples/s: which limits a run (common.bench_loader)
    batch  (not in the default rows) training samples/s and wall time to a target test metric at batch
       sizes from 16 to beyond what --batch-size auto picks, the learning rate scaled: common.bench_batch
The default papers are one of each family (vit, resnet, lstm); `--papers all` times every paper but
detection's. A progress line per (row, paper) goes to stderr, with the time left as estimated so far;
Ctrl-C prints the rows measured until then. Prints a markdown table. The rows themselves are in
common/bench_rows.py: this module imports no torch before it has parsed its flags.
"""

import argparse
import statistics
import sys
import time
from types import SimpleNamespace

ROW_NAMES = ("a", "b", "c", "d", "e", "f", "g", "h", "i")
DEFAULT_ROWS = ("a", "b", "c", "d", "e", "f", "g")
DEFAULT_PAPERS = ("vit", "resnet", "lstm")  # one of each family, as docs/performance.md's table
PER_PAPER = set("abcdefg")  # rows measured paper by paper (h, i and batch run as one piece)
ONLY = {"c": ("lstm",)}  # rows that time some papers only


def markdown(rows: list[dict]) -> str:
    """One table per run of rows with the same columns (row h has its own)."""
    tables, start = [], 0
    for end in range(1, len(rows) + 1):
        if end == len(rows) or rows[end].keys() != rows[start].keys():
            keys = list(rows[start])
            lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows[start:end]]
            tables.append("\n".join(lines))
            start = end
    return "\n\n".join(tables)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m common.bench", description=__doc__.split("\n")[0])
    p.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                   help="which rows, e.g. a,b; h (the memory of each layout); i (the loader); or batch (see "
                        "common.bench_batch)")
    p.add_argument("--papers", help="which papers: names, or all (every paper but detection's); default "
                                    f"{','.join(DEFAULT_PAPERS)}; for row batch resnet,vit; for row i vit,resnet")
    p.add_argument("--repeats", type=int, default=5, help="alternated repeats per measurement (median reported)")
    p.add_argument("--steps", type=int, default=60, help="training steps per run in rows a and f")
    p.add_argument("--iters", type=int, default=10, help="calls per timed measurement in rows b to e and g")
    p.add_argument("--backend", default="inductor", help="torch.compile backend for rows c, d and g")
    p.add_argument("--quick", action="store_true", help="a short version: few steps and repeats, eager compile, "
                   "row a without its per-feature runs (about 5 minutes for the default papers on 2 cores)")
    p.add_argument("--smoke", action="store_true", help="the quickest: --quick with one step and one call per "
                   "measurement, no warm-up, row g at batch 1 only, rows d and e at batch 4; it shows that the rows "
                   "run for these papers, its numbers mean nothing")
    p.add_argument("--target", type=float, default=0.95, help="row batch: the test metric to reach (default 0.95)")
    p.add_argument("--plot", help="row batch: where to draw its plot (PNG)")
    return p


def plan(rows: list[str], papers: list[str]) -> list[tuple[str, list[str]]]:
    """The pieces measured one after another: (row, papers), a paper at a time where a row allows it."""
    pieces = []
    for r in rows:
        if r in PER_PAPER:
            pieces += [(r, [name]) for name in papers if name in ONLY.get(r, papers)]
        else:
            pieces.append((r, papers))
    return pieces


class Progress:
    """A line on stderr as each piece starts and when it ends, with the time left estimated from the
    pieces done (a row's own mean where it has one, else the mean of all)."""

    def __init__(self, pieces: list[tuple[str, list[str]]]):
        self.pieces, self.took = pieces, []

    def start(self, i: int) -> None:
        r, papers = self.pieces[i]
        print(f"bench: row {r}, {','.join(papers)} ({i + 1}/{len(self.pieces)}) ...", file=sys.stderr, flush=True)

    def done(self, i: int, seconds: float) -> None:
        self.took.append((self.pieces[i][0], seconds))
        mean = statistics.mean(s for _, s in self.took)
        left = sum(statistics.mean([s for r, s in self.took if r == row] or [mean]) for row, _ in self.pieces[i + 1:])
        r, papers = self.pieces[i]
        print(f"bench: row {r}, {','.join(papers)}: {seconds:.1f} s; about {left / 60:.1f} min left",
              file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> str | int:
    args = build_parser().parse_args(argv)
    args.rows = args.rows.split(",")
    unknown = [r for r in args.rows if r not in ROW_NAMES and r != "batch"]
    if unknown:
        print(f"error: unknown row(s) {', '.join(unknown)}; choose from: {', '.join(ROW_NAMES)}, batch", file=sys.stderr)
        return 2
    import torch

    from common import bench_rows
    from common.tracking import device_name

    benched = bench_rows.benched()
    alone = {"batch": "resnet,vit", "i": "vit,resnet"}.get(args.rows[0]) if len(args.rows) == 1 else None
    args.papers = (args.papers or alone or ",".join(DEFAULT_PAPERS)).split(",")
    if args.papers == ["all"]:
        args.papers = benched
    unbenched = [n for n in args.papers if n not in benched]
    if unbenched:  # the rows time batches of one tensor of targets; detection's are lists of boxes
        print(f"error: the bench times classification and sequence papers; not {', '.join(unbenched)} "
              f"(choose from: {', '.join(benched)})", file=sys.stderr)
        return 2
    bench_rows.WARM = not args.smoke
    bench_rows.BATCH = 4 if args.smoke else 64
    args.quick = args.quick or args.smoke
    if args.quick:
        args.repeats, args.steps, args.iters, args.backend = 1, 1 if args.smoke else 4, 1 if args.smoke else 2, "eager"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    command = f"`python -m common.bench {' '.join(argv if argv is not None else sys.argv[1:])}`"
    header = f"{device_name(device)}, torch {torch.__version__}, {torch.get_num_threads()} threads; {command}\n"
    pieces = plan([r for r in args.rows if r != "batch"], args.papers)
    progress, rows, started = Progress(pieces), [], time.perf_counter()
    try:
        for i, (r, papers) in enumerate(pieces):
            progress.start(i)
            begun = time.perf_counter()
            rows += bench_rows.ROWS[r](SimpleNamespace(**{**vars(args), "papers": papers}), device)
            progress.done(i, time.perf_counter() - begun)
    except KeyboardInterrupt:
        print(header + f"(interrupted after {time.perf_counter() - started:.0f} s: the rows measured so far)\n")
        print(markdown(rows) if rows else "(none)")
        return 130
    tables = [markdown(rows)] if rows else []
    if "batch" in args.rows:
        from common.bench_batch import report

        tables.append(report(args.papers, args.target, args.plot))
    table = "\n\n".join(tables)
    print(f"bench: {time.perf_counter() - started:.0f} s in all", file=sys.stderr)
    print(header)
    print(table)
    return table


if __name__ == "__main__":
    out = main()
    sys.exit(out if isinstance(out, int) else 0)
