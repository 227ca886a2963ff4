"""--profile N: N training steps recorded with torch.profiler, after a few warm-up steps.

Each rank writes a Chrome trace, `profile/trace_rank<r>.json` in the run
directory (open it in https://ui.perfetto.dev or chrome://tracing: one row per
thread and CUDA stream, every operator and kernel on a time line), and the
operators that took the most self time (their own time, without the operators
they call) are printed at the end: CPU time, and CUDA time on a GPU.
"""

import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

WARMUP_STEPS = 2  # run under the profiler but not recorded: the first steps allocate, compile, fill caches
TOP_OPERATORS = 15


class StepProfiler:
    """Call `step()` after every optimizer step; it records steps WARMUP_STEPS + 1 to WARMUP_STEPS + N.

    Args:
        steps: N, the steps recorded.
        out_dir: where the trace goes.
        rank: this process's rank (names the trace).
        device: CUDA kernels are recorded too on a GPU.
    """

    def __init__(self, steps: int, out_dir: Path, rank: int, device: torch.device):
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler library's own log: errors and worse only
        cuda = device.type == "cuda"
        self.trace = Path(out_dir) / f"trace_rank{rank}.json"
        self.sort_by = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        self.left, self.table = WARMUP_STEPS + steps, None
        self.profiler = profile(
            activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []),
            schedule=schedule(wait=0, warmup=WARMUP_STEPS, active=steps, repeat=1),
            on_trace_ready=self._write,
        )
        self.profiler.start()

    def _write(self, prof) -> None:
        self.trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.trace))
        self.table = prof.key_averages().table(sort_by=self.sort_by, row_limit=TOP_OPERATORS)

    def step(self) -> None:
        if self.left == 0:
            return
        self.profiler.step()
        self.left -= 1
        if self.left == 0:
            self.profiler.stop()

    @property
    def done(self) -> bool:
        return self.table is not None
