"""Train a paper's model: `python train.py --paper vit`, or `torchrun --nproc_per_node 2 train.py --paper vit`.

This file only parses and checks the command line; the loop is common/trainer.py.
"""

import os
import sys

from common.preemption import EXIT_PREEMPTED, Preempted  # first: its clock counts from here (--time-limit)


def print_papers() -> None:
    from papers import catalog  # what the papers' specs say, read without importing them (or torch)

    rows = [("name", "family", "year", "flavors", "title")]
    for paper in catalog.read():
        rows.append((paper["name"], paper["family"], str(paper["year"]), ", ".join(paper["flavors"]), paper["title"]))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])


def tell_torchrun(line: str) -> None:
    """Under torchrun, this worker's error file (TORCHELASTIC_ERROR_FILE) holds the line, so that the
    launcher's "Root Cause" block shows it (not "error_file: <N/A>")."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        import json
        import time

        with open(path, "w") as f:
            json.dump({"message": {"message": line, "extraInfo": {"timestamp": str(int(time.time()))}}}, f)


def main(argv: list[str] | None = None, record_errors: bool = False) -> int:
    """Parse, then train. Nothing before the training itself imports torch: --help, --list and a
    mistyped flag answer at once.

    Args:
        record_errors: under torchrun, an unexpected exception's traceback goes to its "Root Cause"
            block too (torch.distributed.elastic's `record`).
    """
    from common.config import build_parser
    from common.errors import ConfigError

    argv = sys.argv[1:] if argv is None else argv
    try:
        flags = vars(build_parser().parse_args(argv))
    except ConfigError as e:
        return refuse(e)
    if flags.pop("list", False):
        print_papers()
        return 0
    run = configure_and_train
    if record_errors:
        from torch.distributed.elastic.multiprocessing.errors import record

        run = record(run)
    return run(flags, argv)


def refuse(e: Exception) -> int:
    """A mistake in the user's input: one line on stderr (rank 0's), exit code 2."""
    if os.environ.get("RANK", "0") == "0":
        print(f"train.py: error: {e}", file=sys.stderr)
    tell_torchrun(f"train.py: error: {e}")
    return 2


def configure_and_train(flags: dict, argv: list[str]) -> int:
    from common.config import resolve, resolve_rerun, resolve_resume, validate, world_size_from_env
    from common.data import fetch
    from common.errors import EXIT_NONFINITE, ConfigError, NonFinite

    is_main = os.environ.get("RANK", "0") == "0"
    try:
        resuming = "resume" in flags
        if "rerun" in flags:
            cfg, warning = resolve_rerun(flags)
            if warning and is_main:
                print(f"train.py: warning: {warning}", file=sys.stderr)
        else:
            cfg = resolve_resume(flags) if resuming else resolve(flags)
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        fetch(cfg)  # --download: the files first, which the checks then read
        validate(cfg, world_size=world_size_from_env(), resuming=resuming or restarted)

        from common.trainer import train

        train(cfg, argv, resume=resuming)
    except ConfigError as e:  # checked before any process group starts: every rank stops here, alike
        return refuse(e)
    except NonFinite as e:  # --nonfinite: the line names the step, the value and the last good checkpoint
        if is_main:
            print(f"train.py: error: {e}", file=sys.stderr, flush=True)
        tell_torchrun(f"train.py: error: {e}")
        return EXIT_NONFINITE
    except Preempted as e:  # SIGTERM, SIGUSR1 or --time-limit: a checkpoint to resume from
        if is_main:
            print(f"train.py: {e}", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
    return 0


if __name__ == "__main__":
    sys.exit(main(record_errors=True))
