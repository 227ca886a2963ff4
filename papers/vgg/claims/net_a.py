"""Net A's finished runs, for the deeper nets of table-3-fashion-mnist-deep.yaml to start from (Section 3.1:
"when training deeper architectures, we initialised the first four convolutional layers and the last three
fully-connected layers with the layers of net A").

    python -m papers.vgg.claims.net_a            # after: python -m common.sweep papers/vgg/claims/table-3-fashion-mnist.yaml

Links runs/vgg-table-3-fashion-mnist/A-seed-N to the finished VGG-11 run of seed N of that sweep, so that the
deep sweep's `--init runs/vgg-table-3-fashion-mnist/A-seed-{seed}` starts each of its runs from net A of its
own seed. A seed whose net A has not finished is one line, exit 2.
"""

import sys
from pathlib import Path

from common import run_links

SWEEP = "vgg-table-3-fashion-mnist"
SEEDS = (0, 1, 2)


def link(folder: Path, seeds=SEEDS) -> list[str]:
    runs = run_links.finished_runs(folder, lambda cfg: (cfg.get("flavor"), cfg["seed"]))
    return run_links.link(folder, {f"A-seed-{seed}": ("VGG-11", seed) for seed in seeds}, runs, lambda absent: (
        f"net_a: no finished VGG-11 run of seed {', '.join(str(s) for _, s in absent)} in {folder}; run "
        f"python -m common.sweep papers/vgg/claims/table-3-fashion-mnist.yaml first"))


def build_parser():
    return run_links.parser(__doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> int:
    return run_links.run(build_parser().parse_args(argv), SWEEP, link)


if __name__ == "__main__":
    sys.exit(main())
