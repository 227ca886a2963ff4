"""`--batch-size auto`: the largest per-device micro-batch that fits and still trains; `--lr-scaling`:
the learning rate that goes with a batch.

The batch that fits in memory is not the batch that trains: on a small data set it can leave an
epoch one optimizer step. So auto never takes more than leaves every epoch MIN_STEPS_PER_EPOCH
optimizer steps (a floor stated here, over all processes and micro-steps), nor more than the
training set holds. Within that, on CUDA it tries a real training step and halves the batch after each
out-of-memory error. On a CPU, where running out of memory ends the process
instead of raising, it measures what one sample costs and fits the batch into a
stated budget: CPU_BUDGET_BYTES per process for parameters, gradients, AdamW's
two moments and the activations kept for the backward pass.
"""

import torch

CPU_BUDGET_BYTES = 2 * 2**30  # 2 GiB per process
MAX_BATCH = 4096
MIN_STEPS_PER_EPOCH = 20  # auto's floor: optimizer steps every epoch keeps
from common.choices import LR_SCALINGS
WARMUP_EPOCHS = 5  # Goyal et al.'s gradual warmup, when the learning rate is scaled up


def steps_limit(train_size: int, shards: int) -> int:
    """The largest micro-batch that leaves every epoch MIN_STEPS_PER_EPOCH optimizer steps, when each
    step takes `shards` micro-batches (processes x accumulation steps); at least 1."""
    return max(1, train_size // (MIN_STEPS_PER_EPOCH * shards))


def scaled_lr(lr: float, batch: int, base_batch: int | None, rule: str) -> tuple[float, str]:
    """(the learning rate for `batch`, why): `lr` goes with `base_batch` (the paper's default batch),
    and a batch k times larger takes k times the learning rate (linear, Goyal et al. 2017, "Accurate,
    Large Minibatch SGD") or sqrt(k) times (sqrt, Krizhevsky 2014); none, or no base batch, keeps it."""
    if rule not in LR_SCALINGS:
        raise ValueError(f"unknown lr scaling '{rule}'; choose from: {', '.join(LR_SCALINGS)}")
    if rule == "none" or base_batch is None or batch == base_batch:
        kept = rule == "none" and base_batch not in (None, batch)
        return lr, "--lr-scaling none" if kept else "the batch the learning rate is given for"
    k = batch / base_batch
    factor = k if rule == "linear" else k ** 0.5
    shown = f"{batch}/{base_batch}" if rule == "linear" else f"sqrt({batch}/{base_batch})"
    return lr * factor, f"{lr:g} x {shown}, {rule} scaling from the paper's batch of {base_batch}"


def _activation_bytes(model, inputs, targets, forward_loss) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of one batch."""
    seen, total = set(), 0

    def pack(t):
        nonlocal total
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:
            seen.add(key)
            total += key[1]
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward_loss(model, inputs, targets)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return total


def largest_power_of_two(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def find_micro_batch(build_model, make_batch, forward_loss, device: torch.device, limit: int) -> tuple[int, str]:
    """(the largest power-of-two micro-batch up to `limit` that fits, how it was found).

    Args:
        build_model: () -> a fresh model on the CPU.
        make_batch: n -> (inputs, targets) of n samples, on `device`.
        forward_loss: (model, inputs, targets) -> scalar loss.
        limit: the largest batch worth trying (the data set's share of one process).
    """
    limit = largest_power_of_two(min(limit, MAX_BATCH))
    model = build_model().to(device)
    if device.type == "cuda":
        optimizer = torch.optim.AdamW(model.parameters())
        batch = limit
        while batch >= 1:
            try:
                forward_loss(model, *make_batch(batch)).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                return batch, f"largest power of two up to {limit} that trained a step on {device}"
            except torch.cuda.OutOfMemoryError:
                optimizer.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                batch //= 2
        raise RuntimeError("not even one sample fits on the device")
    probe = min(8, limit)
    per_sample = _activation_bytes(model, *make_batch(probe), forward_loss) / probe
    fixed = 4 * sum(p.numel() * p.element_size() for p in model.parameters())  # weights, grads, 2 moments
    fits = int((CPU_BUDGET_BYTES - fixed) // max(per_sample, 1))
    batch = largest_power_of_two(min(fits, limit))
    return batch, (f"largest power of two up to {limit} within a {CPU_BUDGET_BYTES / 2**30:g} GiB budget "
                   f"per process ({per_sample / 2**20:.2f} MiB of activations per sample)")
