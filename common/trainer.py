"""The training loop shared by every paper, on one process or many.

`train(cfg)` builds the model for the dataset, wraps it for the strategy,
trains with AdamW and warmup-then-cosine, evaluates after every epoch, and
leaves a run directory: config.json, result.json, model.safetensors.
"""

import math
import os
import secrets
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from common import parallel
from common.config import ConfigError, TrainConfig, save as save_config
from common.data import eval_loader, get_dataset, train_loader
from common.optim import build_optimizer, warmup_cosine
from common.tasks import get_task
from common.tracking import NullTracker, Tracker, command_line, device_name, git_commit, resolve_mode, write_json
from papers import get_paper


def default_run_dir(paper: str) -> Path:
    """runs/<paper>-<UTC time>-<id>; under torchrun the id comes from the rendezvous run id."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")[:6] or secrets.token_hex(3)
    return Path("runs") / f"{paper}-{stamp}-{run_id}"


def autocast(precision: str, device: torch.device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


@torch.no_grad()
def evaluate(model, loader, task, env: parallel.Env, precision: str) -> dict[str, float]:
    """The task's metrics over the whole evaluation set: each rank scores its share, then the sums are added."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=env.device)
    for x, y in loader:
        x, y = x.to(env.device, non_blocking=True), y.to(env.device, non_blocking=True)
        with autocast(precision, env.device):
            sums += task.eval_sums(model(x), y)
    model.train()
    return task.metrics(parallel.all_reduce_sum(sums))


def train(cfg: TrainConfig, argv: list[str] | None = None) -> dict:
    """Train as `cfg` says; returns the result (also written to result.json on rank 0)."""
    env = parallel.setup()
    try:
        return _train(cfg, env, argv if argv is not None else sys.argv[1:])
    finally:
        parallel.teardown()


def _train(cfg: TrainConfig, env: parallel.Env, argv: list[str]) -> dict:
    started = time.perf_counter()
    spec, data = get_paper(cfg.paper), get_dataset(cfg.dataset)
    strategy = parallel.resolve_strategy(cfg.strategy, env.world_size)
    task = get_task(data.task, cfg.label_smoothing)

    train_set, test_set = data.load(cfg.data_dir)
    micro_batch = cfg.batch_size // (env.world_size * cfg.grad_accum)
    loader = train_loader(train_set, micro_batch, env.rank, env.world_size, cfg.seed, cfg.num_workers)
    steps_per_epoch = len(loader) // cfg.grad_accum
    if steps_per_epoch == 0:
        raise ConfigError(f"batch size {cfg.batch_size} is larger than the {len(train_set)} training samples of {data.name}")
    total_steps = steps_per_epoch * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, steps_per_epoch * cfg.epochs)
    epochs = math.ceil(total_steps / steps_per_epoch)
    test_loader = eval_loader(test_set, max(256, micro_batch), env.rank, env.world_size)

    run_dir = Path(cfg.out) if cfg.out else parallel.broadcast_object(default_run_dir(cfg.paper))
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.json")
        print(f"config ({strategy}, {env.world_size} process(es), {env.device}):", flush=True)
        for key, value in cfg.to_dict().items():
            print(f"  {key:16s} {value}", flush=True)

    torch.manual_seed(cfg.seed)  # the same initial weights on every rank and every run
    model = spec.build(cfg.flavor, **data.model_kwargs)
    n_params = sum(p.numel() for p in model.parameters())
    model = parallel.parallelize(model, strategy, env, compile=cfg.compile)
    eval_model = parallel.unwrap_ddp(model)
    optimizer = build_optimizer(parallel.unwrap(model), cfg.lr, cfg.weight_decay)
    scheduler = warmup_cosine(optimizer, cfg.warmup_steps, total_steps)
    scaler = torch.amp.GradScaler(env.device.type, enabled=cfg.precision == "fp16")

    mode = resolve_mode(cfg.wandb)
    tracker = Tracker(mode, cfg.wandb_project, run_dir, run_dir.name, cfg.to_dict()) if env.is_main else NullTracker()
    tracker.summary({"params": n_params})

    step, train_seconds, best, history = 0, 0.0, None, []
    progress = tqdm(total=total_steps, disable=not env.is_main, desc=f"{cfg.paper} {cfg.flavor}", unit="step")
    window_start, window_steps = time.perf_counter(), 0
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        batches = iter(loader)
        epoch_start = time.perf_counter()
        for _ in range(min(steps_per_epoch, total_steps - step)):
            loss = torch.zeros((), device=env.device)
            for micro in range(cfg.grad_accum):
                x, y = next(batches)
                x, y = x.to(env.device, non_blocking=True), y.to(env.device, non_blocking=True)
                with parallel.no_sync(model, skip=micro < cfg.grad_accum - 1):
                    with autocast(cfg.precision, env.device):
                        micro_loss = task.loss(model(x), y) / cfg.grad_accum
                    scaler.scale(micro_loss).backward()
                loss += micro_loss.detach()
            if cfg.clip_grad > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step += 1
            window_steps += 1
            progress.update(1)
            if step % cfg.log_every == 0 or step == total_steps:
                loss = parallel.all_reduce_sum(loss) / env.world_size
                now = time.perf_counter()
                rate = window_steps * cfg.batch_size / (now - window_start)
                window_start, window_steps = now, 0
                lr = scheduler.get_last_lr()[0]
                tracker.log({"train/loss": loss.item(), "train/lr": lr, "train/samples_per_s": rate}, step=step)
                progress.set_postfix(loss=f"{loss.item():.4f}", lr=f"{lr:.2e}", samples_s=f"{rate:.0f}")
        train_seconds += time.perf_counter() - epoch_start

        metrics = evaluate(eval_model, test_loader, task, env, cfg.precision)
        value = metrics[task.metric]
        if best is None or (value > best[0] if task.higher_is_better else value < best[0]):
            best = (value, epoch + 1)
        history.append(value)
        tracker.log({f"eval/{k}": v for k, v in metrics.items()} | {"epoch": epoch + 1}, step=step)
        window_start, window_steps = time.perf_counter(), 0  # evaluation time is not training throughput
        if env.is_main:
            progress.write(f"epoch {epoch + 1}/{epochs}: test {task.metric} {value:.4f}, loss {metrics['loss']:.4f}")
    progress.close()

    result = {
        "paper": cfg.paper,
        "flavor": cfg.flavor,
        "dataset": cfg.dataset,
        "task": task.kind,
        "metric": task.metric,
        "higher_is_better": task.higher_is_better,
        "final": history[-1],
        "best": best[0],
        "best_epoch": best[1],
        "params": n_params,
        "epochs": epochs,
        "steps": step,
        "batch_size": cfg.batch_size,
        "strategy": strategy,
        "world_size": env.world_size,
        "precision": cfg.precision,
        "compile": cfg.compile,
        "samples_per_s": step * cfg.batch_size / train_seconds,
        "wall_s": time.perf_counter() - started,
        "device": device_name(env.device),
        "torch": torch.__version__,
        "commit": git_commit(),
        "wandb_run_id": tracker.run_id,
        "command": command_line(argv),
        "run_dir": str(run_dir),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if env.is_main:
        state = {k: v.detach().cpu().contiguous() for k, v in parallel.unwrap(model).state_dict().items()}
        save_file(state, run_dir / "model.safetensors")
        write_json(run_dir / "result.json", result)
        tracker.summary({f"final/{task.metric}": result["final"], f"best/{task.metric}": result["best"]} | result)
        where = tracker.finish()
        print(f"test {task.metric}: {result['final']:.4f} (best {result['best']:.4f} at epoch {result['best_epoch']})")
        print(f"run directory: {run_dir}")
        if where:
            print(where)
    return result
