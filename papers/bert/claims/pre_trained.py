"""The pre-trained runs of table-5-pre-training.yaml, for table-5.yaml's fine-tuning to start from (Section 5.1:
each pre-training task's model fine-tuned on the same task).

    python -m papers.bert.claims.pre_trained     # after: python -m common.sweep papers/bert/claims/table-5-pre-training.yaml

Links runs/bert-table-5-pre-training/DATASET-seed-N to the finished pre-training run of that data set (pydoc-pairs:
MLM + NSP; pydoc-segments: No NSP; pydoc-ltr: LTR & No NSP) and seed, so that table-5.yaml's
`--init runs/bert-table-5-pre-training/DATASET-seed-{seed}` fine-tunes each seed from the pre-training of its own
seed. A run that has not finished is one line, exit 2.
"""

import sys
from pathlib import Path

from common import run_links

SWEEP = "bert-table-5-pre-training"
DATASETS = ("pydoc-pairs", "pydoc-segments", "pydoc-ltr")
SEEDS = (0, 1, 2)


def link(folder: Path, datasets=DATASETS, seeds=SEEDS) -> list[str]:
    runs = run_links.finished_runs(folder, lambda cfg: (cfg["dataset"], cfg["seed"]))
    names = {f"{dataset}-seed-{seed}": (dataset, seed) for dataset in datasets for seed in seeds}
    return run_links.link(folder, names, runs, lambda absent: (
        f"pre_trained: no finished run of {', '.join(f'{d} seed {s}' for d, s in absent)} in {folder}; run "
        f"python -m common.sweep papers/bert/claims/table-5-pre-training.yaml first"))


def build_parser():
    return run_links.parser(__doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> int:
    return run_links.run(build_parser().parse_args(argv), SWEEP, link)


if __name__ == "__main__":
    sys.exit(main())
