"""Bahdanau et al.'s Figure 2, BLEU against source length: every run of the sweep bahdanau-length
(length.yaml beside this file: RNNsearch and the RNN Encoder-Decoder, tiny, on long-pairs, seeds 0, 1, 2)
decodes the test split as the trainer's evaluation does (greedy, the seq2seq task's own decoding), and
BLEU is scored in each 5-word bin of source length (5-9, 10-14, ..., 45-49: corpus BLEU of the bin's
100 sentences, by the task's metric, sacrebleu's with its 13a tokens).

    python -m papers.bahdanau.claims.length [--results-dir results]

Prints, per bin, each model's mean BLEU over its seeds with the 95% interval and RNNsearch minus the
Encoder-Decoder (Welch's interval), and writes every run's numbers to length.json and the figure to
length.png beside this file. Needs the sweep's run directories (their weights).
"""

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from common import seeds
from common.claims import provenance, saved_provenance
from common.errors import ConfigError
from common.export import load_run
from common.leaderboard import local_results, sweep_runs

# Nothing above imports torch: --help and a mistyped flag are answered at once.

HERE = Path(__file__).parent
SWEEP = "bahdanau-length"
PAPERS = {"gru": "RNN Encoder-Decoder (gru tiny)", "bahdanau": "RNNsearch (bahdanau tiny)"}
FONTS = {"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 9}  # the figure is shown at its own size


def bleu_by_length(run_dir: Path, batch_size: int = 128, per_bin: int | None = None) -> dict[str, dict]:
    """A finished seq2seq run's test split decoded by its final weights and scored per BIN-word bin of
    source length: {first length of the bin, as a string ("5", "10", ...) or "all" for the whole split:
    {"bleu" (0 to 100), "exact_match", "sentences"}}. Decoding and scores are the seq2seq task's (greedy,
    as the trainer evaluates), one bin at a time; per_bin: only each bin's first that many sentences."""
    import torch
    from torch.utils.data import DataLoader, Subset

    from common.data import dataset_for, options
    from common.data.long_pairs import length_bin
    from common.tasks import get_task

    model, cfg = load_run(run_dir)
    data = dataset_for(cfg)
    _, test = data.read(**options(cfg))
    if data.task != "seq2seq" or not hasattr(test, "sizes"):
        raise ConfigError(f"{run_dir} trained {cfg.paper} on {cfg.dataset}; BLEU by length reads a seq2seq run")
    task = get_task(data.task, data.facts(**options(cfg)))
    bins = defaultdict(list)  # first length of the bin -> test indices
    for i, n in enumerate(test.sizes):
        if per_bin is None or len(bins[length_bin(n)]) < per_bin:
            bins[length_bin(n)].append(i)
    collate = data.collate(cfg.pad_multiple)
    scores, everything = {}, task.build_metrics(torch.device("cpu"))
    with torch.no_grad():
        for first in sorted(bins):
            metrics = task.build_metrics(torch.device("cpu"))
            for inputs, targets in DataLoader(Subset(test, bins[first]), batch_size=batch_size, collate_fn=collate):
                outputs = task.forward(model, inputs, targets)
                task.update(metrics, outputs, targets)
                task.update(everything, outputs, targets)
            m = task.compute(metrics)
            scores[str(first)] = {"bleu": m["bleu"], "exact_match": m["exact_match"], "sentences": len(bins[first])}
        m = task.compute(everything)
    scores["all"] = {"bleu": m["bleu"], "exact_match": m["exact_match"], "sentences": sum(map(len, bins.values()))}
    return scores


def measure(results_dir: str) -> dict:
    runs, _ = sweep_runs(local_results(results_dir), SWEEP)
    record = {}
    for r in sorted(runs, key=lambda r: (r["paper"], r["config"]["seed"])):
        scores = bleu_by_length(Path(r["run_dir"]))
        record.setdefault(r["paper"], {})[str(r["config"]["seed"])] = {"run_id": r["run_id"], "bleu": scores}
        print(f"{r['paper']} seed {r['config']['seed']}: bleu {scores['all']['bleu']:.2f}; by length " +
              ", ".join(f"{k} {v['bleu']:.1f}" for k, v in scores.items() if k != "all"), file=sys.stderr)
    return record


def summary(record: dict) -> list[dict]:
    """Per bin (and "all"): each paper's mean BLEU over its seeds with the 95% interval, and RNNsearch
    minus the Encoder-Decoder with Welch's interval (where both were run)."""
    papers = [p for p in PAPERS if p in record]
    first = next(iter(record[papers[0]].values()))["bleu"]
    rows = []
    for key in first:
        values = {p: [run["bleu"][key]["bleu"] for run in record[p].values()] for p in papers}
        row = {"bin": key, "sentences": first[key]["sentences"]}
        for p in papers:
            s = seeds.summarize(values[p])
            row |= {p: s.mean, f"{p}_low": s.low, f"{p}_high": s.high, f"{p}_n": s.n}
        if len(papers) == 2:
            row["difference"], row["low"], row["high"] = seeds.welch(values["bahdanau"], values["gru"])
        rows.append(row)
    return rows


def plot(rows: list[dict], record: dict, out: Path) -> None:
    import matplotlib

    from common.data.long_pairs import BIN

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = [r for r in rows if r["bin"] != "all"]
    x = [int(r["bin"]) + (BIN - 1) / 2 for r in bins]  # the bin's middle length
    with plt.rc_context(FONTS):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for paper, name in PAPERS.items():
            if paper not in record:
                continue
            for run in record[paper].values():
                ax.plot(x, [run["bleu"][r["bin"]]["bleu"] for r in bins], alpha=0.25, linewidth=1,
                        color="tab:red" if paper == "bahdanau" else "tab:blue")
            line, = ax.plot(x, [r[paper] for r in bins], marker="o", label=f"{name}, mean of {bins[0][f'{paper}_n']} "
                            f"seeds, 95% interval", color="tab:red" if paper == "bahdanau" else "tab:blue")
            ax.fill_between(x, [r[f"{paper}_low"] for r in bins], [r[f"{paper}_high"] for r in bins],
                            color=line.get_color(), alpha=0.2)
        ax.set_xticks(x, [f"{r['bin']}-{int(r['bin']) + BIN - 1}" for r in bins])
        ax.set(xlabel="source sentence length (words)", ylabel="test BLEU (greedy)", ylim=(0, 100),
               title="long-pairs: BLEU against source length (Bahdanau et al., Fig. 2)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out, dpi=110)  # 770 px wide: the page shows it at its own size


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m papers.bahdanau.claims.length", description=__doc__.split("\n")[0])
    p.add_argument("--results-dir", default="results", help="where the sweep's results are (their run_dir: the runs)")
    p.add_argument("--summary-only", action="store_true",
                   help="no evaluation: the table and figure again from length.json's numbers")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from common.data.long_pairs import BIN

    run_ids = lambda record: [run["run_id"] for by_seed in record.values() for run in by_seed.values()]
    if args.summary_only:  # the runs' numbers as the last full run wrote them
        saved = json.loads((HERE / "length.json").read_text())
        record = saved["runs"]
        written = provenance(run_ids(record), saved_provenance(saved, run_ids(record)))
    else:
        try:
            record = measure(args.results_dir)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        written = provenance(run_ids(record))
    rows = summary(record)
    (HERE / "length.json").write_text(json.dumps({"provenance": written, "sweep": SWEEP, "runs": record,
                                                  "summary": rows}, indent=1) + "\n")
    plot(rows, record, HERE / "length.png")
    papers = [p for p in PAPERS if p in record]
    print(f"| source words | {' | '.join(PAPERS[p] for p in papers)} | RNNsearch minus Encoder-Decoder |\n"
          f"|---|{'---|' * len(papers)}---|")
    for r in rows:
        words = "all" if r["bin"] == "all" else f"{r['bin']}-{int(r['bin']) + BIN - 1}"
        cells = [f"{r[p]:.2f} [{r[f'{p}_low']:.2f}, {r[f'{p}_high']:.2f}]" for p in papers]
        diff = f"{r['difference']:+.2f} [{r['low']:+.2f}, {r['high']:+.2f}]" if "difference" in r else "-"
        print(f"| {words} | {' | '.join(cells)} | {diff} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
