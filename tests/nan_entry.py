"""train.py as torchrun starts it, with a NaN put into one rank's inputs at some steps: the entry point
of the non-finite-loss tests (`NAN_STEPS=3,5 NAN_RANK=1 torchrun ... tests/nan_entry.py --paper vit ...`)."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import trainer  # noqa: E402
from train import main  # noqa: E402

STEPS = {int(s) for s in os.environ["NAN_STEPS"].split(",")}
RANK = int(os.environ.get("NAN_RANK", "1"))
next_batch = trainer.Trainer.next_batch


def poisoned(self, batches, padding):
    inputs, targets = next_batch(self, batches, padding)
    if self.env.rank == RANK and self.state.step + 1 in STEPS:  # the step this batch is for
        inputs = inputs.clone()
        inputs.view(-1)[0] = float("nan")
    return inputs, targets


trainer.Trainer.next_batch = poisoned

if __name__ == "__main__":
    sys.exit(main())
