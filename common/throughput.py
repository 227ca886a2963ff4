"""Training speed: samples/s, input elements/s, time spent waiting for data, and model
FLOPs utilisation (MFU).

MFU = FLOPs computed per second on a device / the device's peak FLOP/s. The
training FLOPs (forward and backward) are counted once, with
torch.utils.flop_counter.FlopCounterMode, on a copy of the model on the meta
device (nothing runs, nothing changes), for one batch; they are scaled by the
input elements (pixels or steps, padding included) that each batch holds, so
variable-size batches are counted by their size. The peak comes from a table of
known accelerators, or, on a CPU or an unknown device, from a short
matrix-multiply measurement at start.
"""

import time

import torch
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

# Dense peak TFLOP/s per device from the vendors' data sheets (without sparsity),
# by the precision the matrix units run in: bf16/fp16, tf32, fp32.
PEAK_TFLOPS = {
    "H200": {"bf16": 989.0, "tf32": 494.5, "fp32": 66.9},
    "H100 SXM": {"bf16": 989.0, "tf32": 494.5, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100": {"bf16": 989.0, "tf32": 494.5, "fp32": 66.9},
    "A100": {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "V100": {"bf16": 125.0, "tf32": 15.7, "fp32": 15.7},  # fp16 tensor cores; no bf16
    "L4": {"bf16": 121.0, "tf32": 60.0, "fp32": 30.3},
}


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                        _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
    """A convolution's backward: the input's gradient and the weight's each take the forward's multiply-adds.
    torch 2.14's own formula counts the weight's gradient of a grouped convolution as if it had one group
    (G times too many: 32 times for ResNeXt's 32 paths, C times for a depthwise convolution's C channels)."""
    forward = conv_flop_count(x_shape, w_shape, grad_out_shape, transposed)
    return forward * (bool(output_mask[0]) + bool(output_mask[1]))


# the formulas that replace torch's own in every count of this module
FORMULAS = {torch.ops.aten.convolution_backward: conv_backward_flops}


def training_flops(build_model, inputs, targets, forward_loss) -> float:
    """FLOPs of one forward and backward pass over a batch, counted on the meta device.

    Args:
        build_model: () -> the model (called under torch.device("meta")).
        inputs, targets: one batch, on any device.
        forward_loss: (model, inputs, targets) -> scalar loss.
    """
    try:
        with torch.device("meta"):
            model = build_model()
        with FlopCounterMode(display=False, custom_mapping=FORMULAS) as counter:
            forward_loss(model, _to_meta(inputs), _to_meta(targets)).backward()
    except (NotImplementedError, RuntimeError):
        # a model whose work depends on the data (non-maximum suppression, matching boxes) cannot
        # run on the meta device: count one real step on the batch's device instead
        with torch.random.fork_rng(devices=[]):  # the run's random draws stay as they were
            model = build_model().to(_device(inputs))
            with FlopCounterMode(display=False, custom_mapping=FORMULAS) as counter:
                forward_loss(model, inputs, targets).backward()
    return counter.get_total_flops()


def _device(batch) -> torch.device:
    """The device of a batch's first tensor."""
    if torch.is_tensor(batch):
        return batch.device
    items = batch.values() if isinstance(batch, dict) else batch
    return next(_device(v) for v in items if torch.is_tensor(v) or isinstance(v, (dict, list, tuple)))


def forward_macs(build_model, *inputs_shape: int) -> int:
    """Multiply-adds of one forward pass in eval mode on one input of this shape (C, H, W) or (T, F),
    counted on the meta device: what papers call "multiply-adds" or "FLOPs" (one multiply and one add
    each; FlopCounterMode counts them as 2 FLOPs).

    Args:
        build_model: () -> the model (called under torch.device("meta")).
        inputs_shape: one sample's shape, without the batch.
    """
    with torch.device("meta"):
        model = build_model().eval()
        x = torch.empty(1, *inputs_shape)
    with FlopCounterMode(display=False, custom_mapping=FORMULAS) as counter, torch.no_grad():
        model(x)
    return counter.get_total_flops() // 2


def _to_meta(batch):
    if isinstance(batch, dict):
        return {k: _to_meta(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_meta(v) for v in batch)
    return batch.to("meta") if torch.is_tensor(batch) else batch


def peak_flops(device: torch.device, precision: str) -> tuple[float, str]:
    """(peak FLOP/s of one device for this precision, where the figure comes from)."""
    kind = "bf16" if precision in ("bf16", "fp16") else ("tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peaks in PEAK_TFLOPS.items():  # most specific names first
            if key in name:
                return peaks[kind] * 1e12, f"table: {name} {kind} {peaks[kind]:g} TFLOP/s"
    measured = measure_matmul_flops(device, torch.bfloat16 if kind == "bf16" else torch.float32)
    return measured, f"measured: {kind} 1024x1024 matmul on {device.type}, {measured / 1e9:.1f} GFLOP/s"


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 1024, repeats: int = 5) -> float:
    """The best FLOP/s of a few n x n matrix products: a practical peak where no table applies."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm up
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


class Meter:
    """Training speed over a window of steps (reset by `read`, and after evaluation).

    Args:
        global_batch: samples per optimizer step over all ranks.
        flops_per_element: training FLOPs per input element (pixel or step, padding
            included: the device computes on it), counted on one batch.
        peak: this device's peak FLOP/s.
    """

    def __init__(self, global_batch: int, flops_per_element: float, peak: float):
        self.global_batch, self.flops_per_element, self.peak = global_batch, flops_per_element, peak
        self.waiting_total = 0.0  # seconds waited for data since the trainer last took it
        self.restart()

    def restart(self) -> None:
        self.start, self.steps, self.elements, self.waiting = time.perf_counter(), 0, 0, 0.0

    def step(self) -> None:
        self.steps += 1

    def add(self, elements: int, waiting: float) -> None:
        """One micro-batch of this rank: its input elements, and the seconds spent waiting for it."""
        self.elements += elements
        self.waiting += waiting
        self.waiting_total += waiting

    def read(self) -> dict[str, float]:
        """Samples/s (all ranks), elements/s and MFU (this device), and the share of time waiting for data."""
        seconds = max(time.perf_counter() - self.start, 1e-9)
        flops = self.flops_per_element * self.elements / seconds
        out = {"samples_per_s": self.steps * self.global_batch / seconds, "elements_per_s": self.elements / seconds,
               "data_wait": self.waiting / seconds, "mfu": flops / self.peak}
        self.restart()
        return out
