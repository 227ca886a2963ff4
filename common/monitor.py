"""What each rank's device holds and does while training: peak memory and, on NVIDIA GPUs, utilization.

On CUDA: the peak bytes PyTorch's caching allocator has handed out
(allocated) and held (reserved) on this rank's device, and the GPU's
utilization (the share of time a kernel ran, sampled by NVML through
nvidia-ml-py) when it is read. Everywhere: the process's peak resident memory
on the host. The trainer reads it every --log-every steps on every rank.
"""

import resource
import sys

import torch


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class DeviceMonitor:
    """Reads one rank's memory peaks and device utilization; keeps the mean utilization of its reads."""

    def __init__(self, device: torch.device):
        self.device = device
        self.utilization_sum, self.reads = 0.0, 0

    def utilization(self) -> float | None:
        """Percent of the last sample period in which a kernel ran on this GPU (NVML), or None."""
        if self.device.type != "cuda":
            return None
        try:
            return float(torch.cuda.utilization(self.device))
        except Exception:  # no NVML (not an NVIDIA driver, or nvidia-ml-py missing): memory is still read
            return None

    def peaks(self) -> dict[str, int]:
        values = {"peak_rss_bytes": peak_rss_bytes()}
        if self.device.type == "cuda":
            values["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device)
            values["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(self.device)
        return values

    def read(self) -> dict[str, float]:
        """The peaks so far and, on an NVIDIA GPU, the utilization now."""
        values = self.peaks()
        utilization = self.utilization()
        if utilization is not None:
            values["utilization"] = utilization
            self.utilization_sum, self.reads = self.utilization_sum + utilization, self.reads + 1
        return values

    def summary(self) -> dict[str, float]:
        """The peaks of the whole run, and the mean utilization of the reads."""
        return self.peaks() | ({"mean_utilization": self.utilization_sum / self.reads} if self.reads else {})


def short_bytes(n: float) -> str:
    """3.2e9 -> '3.0G' (binary units), for the progress bar."""
    unit = 0
    while n >= 1024 and unit < 4:
        n, unit = n / 1024, unit + 1
    return f"{n:.1f}{'BKMGT'[unit]}"
