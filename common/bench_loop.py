"""Bench row a's measurements: the trainer against a bare PyTorch loop, in one launch.

    python -m common.bench_loop --paper vit --steps 60 --repeats 3 [--skips agree,activations,train-metric]
    torchrun --nproc_per_node 2 -m common.bench_loop --paper vit ...

In each repeat, in a rotated order, the same processes train the paper's default run for `--steps`
optimizer steps (same model, data, global batch and optimizer) as:

    trainer          common.trainer's Trainer, as train.py runs it (DDP with several processes)
    bare             a plain loop: DataLoader (a DistributedSampler's share), DDP, AdamW, clipping
    trainer -X       the Trainer with one per-step feature X switched off (common.trainer.BENCH_SKIP):
                     agree (the one all-reduce for a finite loss and a stop request), activations (the
                     saved-activation count on the first and logged steps), train-metric (training accuracy)

Samples/s is steps x global batch over the seconds of the training loop, as result.json counts it
(the first step included, evaluation not). Rank 0 prints one JSON line: {name: [samples/s per repeat]}.
The process group is joined once and kept, so that the configurations alternate inside one launch.
"""

import argparse
import json
import os
import sys
import tempfile
import time

SKIPS = ("agree", "activations", "train-metric")


def bare_loop(cfg, env, steps: int) -> float:
    """The default run's samples/s in a plain DDP loop (no trainer)."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from common.data import get_dataset
    from common.data.collate import to_device
    from common.tasks import call, get_task
    from papers import get_paper

    data = get_dataset(cfg.dataset)
    facts = data.facts(image_size=cfg.image_size)
    task = get_task(data.task, facts, label_smoothing=cfg.label_smoothing)
    torch.manual_seed(cfg.seed)
    model = get_paper(cfg.paper).build_for_data(cfg.flavor, facts).to(env.device)
    if env.world_size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    train_set, _ = data.load(image_size=cfg.image_size)
    sampler = (torch.utils.data.DistributedSampler(train_set, shuffle=True, seed=cfg.seed, drop_last=True)
               if env.world_size > 1 else torch.utils.data.RandomSampler(train_set))
    loader = torch.utils.data.DataLoader(train_set, batch_size=cfg.batch_size // env.world_size, sampler=sampler,
                                         drop_last=True, collate_fn=data.collate(image_size=cfg.image_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    done, busy, epoch = 0, 0.0, 0
    while done < steps:
        if env.world_size > 1:
            sampler.set_epoch(epoch)
        start = time.perf_counter()
        for batch in loader:
            inputs, targets = to_device(batch, env.device)
            loss = task.loss(call(model, inputs), targets)
            loss.backward()
            if cfg.clip_grad > 0:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done == steps:
                break
        if env.device.type == "cuda":
            torch.cuda.synchronize(env.device)
        busy += time.perf_counter() - start
        epoch += 1
    if env.world_size > 1:
        dist.barrier()
    return done * cfg.batch_size / busy


def trainer_run(cfg, env, skip: str, folder: str) -> float:
    """The default run's samples/s through the Trainer (result.json's figure), with `skip` switched off."""
    import contextlib
    import dataclasses
    import io

    from common import parallel
    from common.trainer import BENCH_SKIP, Trainer

    os.environ[BENCH_SKIP] = skip
    out = parallel.broadcast_object(tempfile.mkdtemp(dir=folder))
    cfg = dataclasses.replace(cfg, out=f"{out}/run", results_dir=f"{out}/results")  # not the store
    try:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), \
                contextlib.redirect_stderr(io.StringIO()):
            trainer = Trainer(cfg, env, [], False)
            with trainer.stop:
                return trainer.fit()["samples_per_s"]
    finally:
        os.environ.pop(BENCH_SKIP, None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m common.bench_loop", description=__doc__.split("\n")[0])
    p.add_argument("--paper", required=True)
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skips", default="", help=f"features to switch off in turn, from {', '.join(SKIPS)}")
    p.add_argument("--no-warm-up", action="store_true", help="no first, unmeasured run of each configuration")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    skips = [s for s in args.skips.split(",") if s]
    if set(skips) - set(SKIPS):
        print(f"error: --skips takes {', '.join(SKIPS)}", file=sys.stderr)
        return 2
    from common import parallel
    from common.config import resolve, validate

    env = parallel.setup()
    try:
        cfg = resolve({"paper": args.paper, "wandb": "disabled", "max_steps": args.steps, "log_every": 10})
        validate(cfg, world_size=env.world_size)
        with tempfile.TemporaryDirectory() as folder:
            runs = {"trainer": lambda: trainer_run(cfg, env, "", folder),
                    "bare": lambda: bare_loop(cfg, env, args.steps)}
            runs |= {f"trainer -{s}": (lambda s=s: trainer_run(cfg, env, s, folder)) for s in skips}
            names = list(runs)
            if not args.no_warm_up:
                for name in names:
                    runs[name]()
            measured = {name: [] for name in names}
            for i in range(args.repeats):
                for name in names[i % len(names):] + names[:i % len(names)]:
                    measured[name].append(runs[name]())
        if env.is_main:
            print(json.dumps(measured), flush=True)
    finally:
        parallel.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
