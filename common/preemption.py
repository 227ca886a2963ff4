"""Stopping in time: a scheduler's signal, or the job's wall-clock limit, ends a run with a checkpoint.

SLURM, Kubernetes and torchrun send SIGTERM some seconds before they kill a job, and SLURM's
`--signal` sends SIGUSR1 (or another) ahead of its time limit. A run that gets either finishes the
step it is in; at each step's end the ranks agree on whether any of them was told to stop (one
all-reduce), so that every rank stops after the same step and none waits alone in a collective;
then they save a checkpoint, rank 0 prints one line naming it and the command that resumes it, and
the process exits with EXIT_PREEMPTED. `--time-limit HH:MM:SS` stops the same way once the next
step and a save might not fit in the time left (counted from the start of train.py).

A second signal during the save changes nothing, and a kill during it leaves a checkpoint without
its `.metadata`, which never counts: the newest checkpoint is complete or absent.

Rank 0 then leaves STOPPED (`stopped.json`) in the run directory, for a scheduler's script to decide
on: the reason (a signal's name, "--time-limit", or "nonfinite" for a loss that stopped the run,
common.errors.NonFinite), the step, the checkpoint to resume from, the exit code and the command that
resumes it. It is written atomically once that checkpoint is complete, and removed once a resumed run
has loaded its checkpoint (and by a finished run); a crash writes none. A stop request is worth a
requeue; a non-finite loss is not (it would stop at the same step again), hence the reason.
"""

import signal
import time

EXIT_PREEMPTED = 75  # sysexits.h's EX_TEMPFAIL: the job is to run again
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
STARTED = time.monotonic()  # train.py imports this module before anything heavy
REASONS = ("", *(s.name for s in SIGNALS), "--time-limit")
STOPPED = "stopped.json"  # in the run directory while a run that stopped (not crashed) waits to be resumed


class Preempted(Exception):
    """The run stopped early and saved a checkpoint; the message is the line to print."""


def parse_time_limit(text: str) -> float:
    """Seconds of [[D-]HH:]MM:SS (SLURM's forms: 1:30:00, 90:00, 2-00:00:00). Raises ValueError."""
    days, _, rest = text.rpartition("-") if "-" in text else ("0", "", text)
    parts = rest.split(":")
    try:
        if not 2 <= len(parts) <= 3 or not days.isdigit():
            raise ValueError
        values = [int(p) for p in parts]
        if any(v < 0 for v in values) or any(v >= 60 for v in values[1:]):
            raise ValueError
    except ValueError:
        raise ValueError(f"--time-limit {text}: give HH:MM:SS (or MM:SS, or D-HH:MM:SS)") from None
    hours, minutes, seconds = ([0] * (3 - len(values))) + values
    return float(((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds)


class StopSignals:
    """While inside it, SIGTERM and SIGUSR1 are noted instead of ending the process; `reason` says why
    this rank would stop now (a signal's name, "--time-limit", or "")."""

    def __init__(self, time_limit: float | None = None):
        self.time_limit, self.received, self.previous = time_limit, "", {}

    def __enter__(self):
        for sig in SIGNALS:
            try:
                self.previous[sig] = signal.signal(sig, self._note)
            except ValueError:  # not the main thread: the process's own handlers stay
                pass
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def _note(self, signum, frame) -> None:
        self.received = self.received or signal.Signals(signum).name  # the first one counts

    def reason(self, step_seconds: float, save_seconds: float) -> str:
        if self.received:
            return self.received
        if self.time_limit is not None:
            left = self.time_limit - (time.monotonic() - STARTED)
            if left < 2 * step_seconds + save_seconds:
                return "--time-limit"
        return ""
