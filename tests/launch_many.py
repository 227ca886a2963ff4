"""A test fixture's several runs in one torchrun launch: `torchrun --nproc_per_node N tests/launch_many.py
RUNS.json`, where RUNS.json holds a list of train.py argument lists, trains each in turn in one process
group (each as `torchrun ... train.py ARGS` would), and exits with the first non-zero code.

Every launch costs each process its start (Python, torch and the repository imported: about 5 s of CPU a
process on the 2-core machine) and the launcher its own; a fixture's runs share one instead. The process
group stays up between runs: `parallel.teardown` is held back until the last run has ended.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import parallel  # noqa: E402
from train import main  # noqa: E402


def run_all(runs: list[list[str]]) -> int:
    teardown, parallel.teardown = parallel.teardown, lambda: None
    try:
        for args in runs:
            code = main(args, record_errors=True)
            if code:
                print(f"launch_many: {' '.join(args)} exited {code}", file=sys.stderr)
                return code
        return 0
    finally:
        parallel.teardown = teardown
        teardown()


if __name__ == "__main__":
    sys.exit(run_all(json.loads(Path(sys.argv[1]).read_text())))
