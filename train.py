"""Train a paper's model: `python train.py --paper vit`, or `torchrun --nproc_per_node 2 train.py --paper vit`.

This file only parses and checks the command line; the loop is common/trainer.py.
"""

import os
import sys

from common.preemption import EXIT_PREEMPTED, Preempted  # first: its clock counts from here (--time-limit)


def print_papers() -> None:
    from papers import get_paper, list_papers

    rows = [("name", "family", "year", "flavors", "title")]
    for name in list_papers():
        spec = get_paper(name)
        rows.append((spec.name, spec.family, str(spec.year), ", ".join(spec.flavors), spec.title))
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


def main(argv: list[str] | None = None) -> int:
    from common.config import build_parser, resolve, resolve_rerun, resolve_resume, validate, world_size_from_env
    from common.errors import EXIT_NONFINITE, ConfigError, NonFinite

    argv = sys.argv[1:] if argv is None else argv
    is_main = os.environ.get("RANK", "0") == "0"
    try:
        flags = vars(build_parser().parse_args(argv))
        if flags.pop("list", False):
            print_papers()
            return 0
        resuming = "resume" in flags
        if "rerun" in flags:
            cfg, warning = resolve_rerun(flags)
            if warning and is_main:
                print(f"train.py: warning: {warning}", file=sys.stderr)
        else:
            cfg = resolve_resume(flags) if resuming else resolve(flags)
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        validate(cfg, world_size=world_size_from_env(), resuming=resuming or restarted)

        from common.trainer import train

        train(cfg, argv, resume=resuming)
    except ConfigError as e:  # checked before any process group starts: every rank stops here, alike
        if is_main:
            print(f"train.py: error: {e}", file=sys.stderr)
        tell_torchrun(f"train.py: error: {e}")
        return 2
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
    from torch.distributed.elastic.multiprocessing.errors import record

    sys.exit(record(main)())  # an unexpected exception's traceback goes to torchrun's Root Cause block too
