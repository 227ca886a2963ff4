"""Is this a DTensor? Answered without importing torch.distributed.tensor (half a second on a CPU).

A DTensor exists only once its package has been imported (by tensor parallel, FSDP2 or a DCP
checkpoint), so until then nothing is one; the trainer's per-step code asks this of every gradient.
"""

import sys


def is_dtensor(t) -> bool:
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)
