"""The training loop shared by every paper, on one process or many.

`train(cfg)` builds the model for the dataset, wraps it for the strategy,
trains with AdamW and warmup-then-cosine, evaluates after every epoch,
checkpoints, and leaves a run directory: config.json, result.json,
model.safetensors, checkpoints/. A resumed run (`--resume`, or a torchrun
restart after a crash) continues from its latest complete checkpoint.
"""

import dataclasses
import json
import math
import os
import re
import secrets
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from common import checkpoint, parallel
from common.batchsize import find_micro_batch
from common.config import ConfigError, TrainConfig, save as save_config
from common.data import eval_loader, get_dataset, train_loader
from common.data.collate import element_counts
from common.optim import build_optimizer, warmup_cosine
from common.tasks import get_task
from common.throughput import Meter, peak_flops, training_flops
from common.tracking import (NullTracker, Tracker, command_line, device_name, find_wandb_id, git_commit,
                             resolve_mode, store_result, write_json)
from papers import get_paper


def restart_count() -> int:
    """How many times torchrun has restarted this launch's workers after a failure."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def default_run_dir(paper: str) -> Path:
    """runs/<paper>-<UTC time>-<id>. Under torchrun the id is the rendezvous run id, the same
    for every attempt of one launch, so restarted workers find the folder of the first."""
    rdzv = re.sub(r"[^A-Za-z0-9_]", "", os.environ.get("TORCHELASTIC_RUN_ID", ""))[:12]
    if rdzv and restart_count() > 0:
        earlier = sorted(Path("runs").glob(f"{paper}-*-{rdzv}"))
        if earlier:
            return earlier[-1]
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{paper}-{stamp}-{rdzv or secrets.token_hex(3)}"


def to_device(batch, device: torch.device):
    """A batch (inputs, targets) on the device; inputs may be a dict of the model's keyword arguments."""
    x, y = batch
    if isinstance(x, dict):
        return {k: v.to(device, non_blocking=True) for k, v in x.items()}, y.to(device, non_blocking=True)
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def call(model, inputs):
    """The model on a batch's inputs: `model(images, mask=...)`, `model(x, lengths=...)`, or `model(x)`."""
    if not isinstance(inputs, dict):
        return model(inputs)
    if "images" in inputs:
        return model(inputs["images"], mask=inputs["mask"])
    return model(inputs["x"], lengths=inputs["lengths"])


def autocast(precision: str, device: torch.device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def unmasked(inputs):
    """The padded tensor alone: what a device computes on, masks and lengths aside (for FLOP counts)."""
    return inputs if not isinstance(inputs, dict) else inputs.get("images", inputs.get("x"))


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled so far in this process (a recompile adds one)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


@torch.no_grad()
def evaluate(model, loader, task, env: parallel.Env, precision: str) -> dict[str, float]:
    """The task's metrics over the whole evaluation set: each rank scores its share, then the sums are added.

    A rank whose share has fewer batches repeats a forward whose result it drops, so
    that sharded models (fsdp) keep their collective gathers in step across ranks.
    """
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=env.device)
    batches, first = iter(loader), None
    for _ in range(parallel.all_reduce_max(len(loader))):
        batch = next(batches, None)
        first = first if first is not None else batch
        x, y = to_device(batch if batch is not None else first, env.device)
        with autocast(precision, env.device):
            out = call(model, x)
        if batch is not None:
            sums += task.eval_sums(out, y)
    model.train()
    return task.metrics(parallel.all_reduce_sum(sums))


def train(cfg: TrainConfig, argv: list[str] | None = None, resume: bool = False) -> dict:
    """Train as `cfg` says; returns the result (also written to result.json on rank 0).

    Args:
        resume: continue the run in cfg.out from its latest complete checkpoint.
    """
    env = parallel.setup()
    try:
        return _train(cfg, env, argv if argv is not None else sys.argv[1:], resume or restart_count() > 0)
    finally:
        parallel.teardown()


def _train(cfg: TrainConfig, env: parallel.Env, argv: list[str], resuming: bool) -> dict:
    started = time.perf_counter()
    spec, data = get_paper(cfg.paper), get_dataset(cfg.dataset)
    strategy = parallel.resolve_strategy(cfg.strategy, env.world_size)
    if env.is_main:
        parallel.warn_fallback(cfg.strategy, strategy)
    task = get_task(data.task, cfg.label_smoothing)

    facts = data.facts(data_dir=cfg.data_dir, image_size=cfg.image_size)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank and every run
    model = spec.build_for_data(cfg.flavor, facts)
    n_params = sum(p.numel() for p in model.parameters())

    train_set, test_set = data.load(data_dir=cfg.data_dir, image_size=cfg.image_size)
    collate = data.collate(math.lcm(cfg.pad_multiple, getattr(model, "input_multiple", 1)))
    batch_of = lambda n: (collate or torch.utils.data.default_collate)([train_set[i % len(train_set)] for i in range(n)])

    def forward_loss(m, inputs, targets):
        with autocast(cfg.precision, env.device):
            return task.loss(call(m, inputs), targets)

    if cfg.batch_size == "auto":
        share = len(train_set) // (env.world_size * cfg.grad_accum)
        micro, how = find_micro_batch(lambda: spec.build_for_data(cfg.flavor, facts),
                                      lambda n: to_device(batch_of(n), env.device), forward_loss, env.device, share)
        micro = min(parallel.all_gather_object(micro))  # every rank trains the same global batch
        cfg = dataclasses.replace(cfg, batch_size=micro * env.world_size * cfg.grad_accum)
        if env.is_main:
            print(f"batch size auto: {micro} per device and micro-step, {cfg.batch_size} in all ({how})", flush=True)
    micro_batch = cfg.batch_size // (env.world_size * cfg.grad_accum)
    probe = batch_of(micro_batch)
    flops = training_flops(lambda: spec.build_for_data(cfg.flavor, facts), unmasked(probe[0]), probe[1],
                           lambda m, x, y: task.loss(m(x), y))
    flops_per_element, flops_per_sample = flops / element_counts(probe[0])[1], flops / micro_batch
    peak, peak_source = peak_flops(env.device, cfg.precision)
    loader = train_loader(train_set, cfg.batch_size, micro_batch, env.rank, env.world_size, cfg.seed, cfg.num_workers,
                          collate, cfg.bucketing)
    steps_per_epoch = len(loader) // cfg.grad_accum
    if steps_per_epoch == 0:
        raise ConfigError(f"batch size {cfg.batch_size} is larger than the {len(train_set)} training samples of {data.name}")
    total_steps = steps_per_epoch * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, steps_per_epoch * cfg.epochs)
    epochs = math.ceil(total_steps / steps_per_epoch)
    ckpt_every = cfg.ckpt_every or steps_per_epoch
    test_loader = eval_loader(test_set, max(256, micro_batch), env.rank, env.world_size, collate)

    run_dir = Path(cfg.out) if cfg.out else parallel.broadcast_object(default_run_dir(cfg.paper))
    if resuming and (run_dir / "result.json").exists():  # a restart after the run had finished
        if env.is_main:
            print(f"run {run_dir} has already finished; its result.json stands", flush=True)
        return json.loads((run_dir / "result.json").read_text())
    resume_from = parallel.broadcast_object(checkpoint.latest(run_dir) if resuming else None)

    compile_args = dict(mode=cfg.compile_mode, backend=cfg.compile_backend) if cfg.compile else None
    model = parallel.parallelize(model, strategy, env, compile=compile_args, shard_blocks=spec.shard_blocks,
                                 precision=cfg.precision)
    optimizer = build_optimizer(parallel.unwrap(model), cfg.lr, cfg.weight_decay)
    scheduler = warmup_cosine(optimizer, cfg.warmup_steps, total_steps)
    scaler = torch.amp.GradScaler(env.device.type, enabled=cfg.precision == "fp16")

    state = {"paper": cfg.paper, "flavor": cfg.flavor, "step": 0, "epoch": 0, "samples_in_epoch": 0,
             "best": None, "history": [], "padding": [0, 0], "elements": 0, "data_wait_seconds": 0.0,
             "train_seconds": 0.0, "wall_seconds": 0.0, "wandb_run_id": None}
    if resume_from is not None:  # raises CheckpointError before anything is written
        state = checkpoint.load(resume_from, model, optimizer, env, cfg.paper, cfg.flavor)
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])

    # -- from here on the run directory is written
    wandb_id = (state["wandb_run_id"] or find_wandb_id(run_dir)) if resuming else None
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not (run_dir / "config.json").exists():  # a resumed run keeps the config it started with
            save_config(cfg, run_dir / "config.json")
        where = f"resumed at step {state['step']} from {resume_from}" if resume_from else "new run"
        print(f"{where}; config ({strategy}, {env.world_size} process(es), {env.device}):", flush=True)
        for key, value in cfg.to_dict().items():
            print(f"  {key:16s} {value}", flush=True)
        print(f"speed: {flops_per_sample / 1e9:.4g} GFLOP per sample per training step (counted on one batch); "
              f"peak {peak_source}", flush=True)
    mode = resolve_mode(cfg.wandb)
    tracker = (Tracker(mode, cfg.wandb_project, run_dir, run_dir.name, cfg.to_dict(), resume_id=wandb_id)
               if env.is_main else NullTracker())
    tracker.summary({"params": n_params, "flops_per_sample": flops_per_sample, "peak_flops": peak})
    state["wandb_run_id"] = parallel.broadcast_object(tracker.run_id)

    last_saved = state["step"]

    def save_checkpoint() -> None:
        nonlocal started, last_saved
        if last_saved == state["step"]:
            return
        state["wall_seconds"] += time.perf_counter() - started
        started = time.perf_counter()
        extra = {"scheduler": scheduler.state_dict(), "scaler": scaler.state_dict()}
        checkpoint.save(run_dir, state["step"], model, optimizer, state | extra, env, cfg.keep_ckpts)
        last_saved = state["step"]

    memory, graphs_after_first_step = None, None
    eval_model = parallel.eval_module(model)
    progress = tqdm(total=total_steps, initial=state["step"], disable=not env.is_main,
                    desc=f"{cfg.paper} {cfg.flavor}", unit="step")
    meter = Meter(cfg.batch_size, flops_per_element, peak)
    elements_name = "pixels_per_s" if data.inputs == "image" else "tokens_per_s"
    for epoch in range(state["epoch"], epochs):
        loader.epoch_sampler.set_epoch(epoch, start=state["samples_in_epoch"])
        batches = iter(loader)
        padding = [0, 0]  # padded and all input elements this epoch, on this rank
        epoch_start, epoch_first_step = time.perf_counter(), state["step"]
        done_in_epoch = state["samples_in_epoch"] // cfg.batch_size
        for _ in range(min(steps_per_epoch - done_in_epoch, total_steps - state["step"])):
            loss = torch.zeros((), device=env.device)
            for micro in range(cfg.grad_accum):
                waiting = time.perf_counter()
                batch = next(batches)
                valid, total = element_counts(batch[0])
                meter.add(total, time.perf_counter() - waiting)
                padding = [padding[0] + total - valid, padding[1] + total]
                x, y = to_device(batch, env.device)
                with parallel.gradient_sync(model, enabled=micro == cfg.grad_accum - 1):
                    with autocast(cfg.precision, env.device):
                        micro_loss = task.loss(call(model, x), y) / cfg.grad_accum
                    scaler.scale(micro_loss).backward()
                loss += micro_loss.detach()
            if cfg.clip_grad > 0:
                scaler.unscale_(optimizer)
                parallel.clip_grad_norm_(model.parameters(), cfg.clip_grad)
            scaler.step(optimizer)
            scaler.update()
            if memory is None:  # gradients and optimizer state both exist now
                memory = parallel.memory_per_rank(model, optimizer)
                graphs_after_first_step = compiled_graphs()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            state["step"] += 1
            state["samples_in_epoch"] += cfg.batch_size
            meter.step()
            progress.update(1)
            step = state["step"]
            if step % cfg.log_every == 0 or step == total_steps:
                loss = (parallel.all_reduce_sum(loss) / env.world_size).item()
                speed, lr = meter.read(), scheduler.get_last_lr()[0]
                row = {"train/loss": loss, "train/lr": lr, "train/samples_per_s": speed["samples_per_s"],
                       f"train/{elements_name}": speed["elements_per_s"], "train/data_wait": speed["data_wait"],
                       "train/mfu": speed["mfu"]}
                if cfg.compile:
                    row["compile/recompiles"] = compiled_graphs() - graphs_after_first_step
                tracker.log(row, step=step)
                progress.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", samples_s=f"{speed['samples_per_s']:.0f}",
                                     mfu=f"{speed['mfu']:.1%}")
            if step % ckpt_every == 0 and state["samples_in_epoch"] < steps_per_epoch * cfg.batch_size:
                save_checkpoint()  # mid-epoch; the epoch's end saves after its evaluation
        epoch_seconds = time.perf_counter() - epoch_start
        state["train_seconds"] += epoch_seconds
        epoch_rate = (state["step"] - epoch_first_step) * cfg.batch_size / epoch_seconds
        state["elements"] += padding[1]
        state["data_wait_seconds"] += meter.waiting_total
        meter.waiting_total = 0.0

        metrics = evaluate(eval_model, test_loader, task, env, cfg.precision)
        value = metrics[task.metric]
        best = state["best"]
        if best is None or (value > best[0] if task.higher_is_better else value < best[0]):
            state["best"] = (value, epoch + 1)
        state["history"].append(value)
        padding = parallel.all_reduce_sum(torch.tensor(padding, dtype=torch.float64, device=env.device)).tolist()
        state["padding"] = [a + b for a, b in zip(state["padding"], padding)]
        metrics["padding_waste"] = padding[0] / padding[1] if padding[1] else 0.0
        state["epoch"], state["samples_in_epoch"] = epoch + 1, 0
        tracker.log({f"eval/{k}": v for k, v in metrics.items() if k != "padding_waste"}
                    | {"epoch": epoch + 1, "train/padding_waste": metrics["padding_waste"],
                       "train/epoch_samples_per_s": epoch_rate}, step=state["step"])
        meter.restart()  # evaluation time is not training time
        if env.is_main:
            progress.write(f"epoch {epoch + 1}/{epochs}: test {task.metric} {value:.4g}, loss {metrics['loss']:.4g}")
        if state["step"] % ckpt_every == 0 or epoch + 1 == epochs or cfg.ckpt_every is None:
            save_checkpoint()
    progress.close()

    weights = parallel.full_state_dict(model)  # every rank takes part in gathering fsdp shards
    memory = parallel.all_gather_object(memory)
    result = {
        "run_id": run_dir.name,
        "paper": cfg.paper,
        "flavor": cfg.flavor,
        "dataset": cfg.dataset,
        "task": task.kind,
        "metric": task.metric,
        "higher_is_better": task.higher_is_better,
        "final": state["history"][-1],
        "best": state["best"][0],
        "best_epoch": state["best"][1],
        "params": n_params,
        "epochs": epochs,
        "steps": state["step"],
        "batch_size": cfg.batch_size,
        "strategy": strategy,
        "world_size": env.world_size,
        "precision": cfg.precision,
        "compile": cfg.compile,
        "samples_per_s": state["step"] * cfg.batch_size / state["train_seconds"],
        elements_name: state["elements"] / state["train_seconds"],
        "mfu": flops_per_element * state["elements"] / state["train_seconds"] / peak,
        "flops_per_sample": flops_per_sample,
        "peak_flops": peak,
        "peak_source": peak_source,
        "data_wait": state["data_wait_seconds"] / state["train_seconds"],
        "recompiles": compiled_graphs() - graphs_after_first_step if cfg.compile and graphs_after_first_step else 0,
        "padding_waste": state["padding"][0] / state["padding"][1] if state["padding"][1] else 0.0,
        "bucketing": cfg.bucketing,
        "memory_per_rank": memory,
        "wall_s": state["wall_seconds"] + time.perf_counter() - started,
        "device": device_name(env.device),
        "torch": torch.__version__,
        "commit": git_commit(),
        "wandb_run_id": state["wandb_run_id"],
        "command": command_line(argv),
        "run_dir": str(run_dir),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.to_dict(),
    }
    if env.is_main:
        save_file({k: v.contiguous() for k, v in weights.items()}, run_dir / "model.safetensors")
        write_json(run_dir / "result.json", result)
        store_result(result, Path(cfg.results_dir))
        per_rank = {f"memory/rank{r}/{k}": v for r, m in enumerate(memory) if m for k, v in m.items()}
        tracker.summary({f"final/{task.metric}": result["final"], f"best/{task.metric}": result["best"]}
                        | per_rank | {k: v for k, v in result.items() if k not in ("memory_per_rank", "config")})
        where = tracker.finish()
        print(f"test {task.metric}: {result['final']:.4g} (best {result['best']:.4g} at epoch {result['best_epoch']})")
        print(f"run directory: {run_dir}")
        if where:
            print(where)
    return result
