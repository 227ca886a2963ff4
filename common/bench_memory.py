"""What a strategy holds on each rank and how long its step takes: one layout of row h of common.bench,
run under torchrun (`python -m common.bench --rows h` launches one per layout).

    torchrun --nproc_per_node 4 -m common.bench_memory --paper gpt --flavor GPT-2-124M --block 256 \\
        --dp-shard 2 --tp 2 --ac full --out h.json
    torchrun --nproc_per_node 4 -m common.bench_memory --paper vit --flavor ViT-B/16 --dp-replicate 2 \\
        --pp 2 --pp-schedule gpipe --out h.json

Each rank trains a few steps on random data of the model's kind (token ids, or images) at a global batch
split between the data-parallel ranks (with --pp, through the stages in --microbatches pieces), with
the trainer's own pieces (common.mesh, common.parallel, common.pipeline, common.activations,
common.optim), and reports, per rank, the bytes of parameters, gradients, AdamW's
state and the activations a forward keeps for backward, and the median seconds of the steps after the
first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from common.choices import AC_MODES, PP_SCHEDULES

# torch and the trainer's pieces are imported in the functions that use them: --help imports no torch
if TYPE_CHECKING:
    import torch


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m common.bench_memory", description=__doc__.split("\n")[0])
    p.add_argument("--paper", required=True)
    p.add_argument("--flavor", required=True)
    p.add_argument("--block", type=int, default=256, help="positions of a language model's samples")
    p.add_argument("--batch", type=int, default=4, help="the global batch")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--dp-replicate", type=int)
    p.add_argument("--dp-shard", type=int)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--pp-schedule", choices=PP_SCHEDULES, default="1f1b")
    p.add_argument("--microbatches", type=int, help="default: --pp")
    p.add_argument("--ac", choices=AC_MODES, default="none")
    p.add_argument("--out", required=True, help="the JSON file rank 0 writes")
    return p


def parse(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def batch(model, args, n: int, seed: int):
    """n random samples of the model's kind, and their targets: next tokens, or classes."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if hasattr(model, "vocab_size"):
        tokens = torch.randint(0, model.vocab_size, (n, args.block + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]
    size = model.img_size if isinstance(model.img_size, tuple) else (model.img_size, model.img_size)
    images = torch.randn(n, model.in_chans, *size, generator=g)
    return images, torch.randint(0, model.get_classifier().out_features, (n,), generator=g)


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    import torch

    from common import mesh, parallel, pipeline
    from common.activations import SavedActivations, apply_checkpointing
    from common.optim import build_optimizer
    from papers import get_paper

    env = parallel.setup()
    try:
        strategy = parallel.resolve_strategy(args.strategy, env.world_size)
        layout = mesh.resolve(strategy, env.world_size, args.dp_replicate, args.dp_shard, args.tp, args.pp)
        device_mesh = mesh.build(layout, env.device.type) if layout.strategy not in ("ddp", "fsdp") else None
        spec = get_paper(args.paper)
        torch.manual_seed(0)
        model = spec.build(args.flavor)
        counter = SavedActivations(apply_checkpointing(model, spec.shard_blocks, args.ac))
        inputs, targets = batch(model, args, args.batch // layout.dp, seed=layout.dp_rank(env.rank))
        if layout.pp > 1:
            stages = pipeline.stages_of(layout.pp_rank(env.rank), layout.pp, args.pp_schedule)
            pipeline.split(model, spec.shard_blocks, spec.pipeline, stages,
                           layout.pp * pipeline.STAGES_PER_RANK[args.pp_schedule])
        model = parallel.parallelize(model, layout.strategy, env, shard_blocks=spec.shard_blocks,
                                     tp_plan=spec.tp_plan, layout=layout, mesh=device_mesh)
        pipe = (pipeline.Pipeline(model, spec.pipeline, layout, device_mesh, env.rank, env.device, args.pp_schedule,
                                  args.microbatches or layout.pp, loss_of) if layout.pp > 1 else None)
        optimizer = build_optimizer(parallel.unwrap(model), 1e-4, 0.0)
        seconds, memory = [], None
        for _ in range(args.steps):
            start = time.perf_counter()
            with counter:
                if pipe is None:
                    loss = loss_of(model(inputs), targets)
                else:  # forwards and backwards interleaved: the counter keeps their peak
                    pipe.step(inputs, targets)
            if pipe is None:
                loss.backward()
            else:
                pipe.sync_shared_gradients()
            optimizer.step()
            if memory is None:  # gradients and AdamW's state both exist now
                memory = parallel.memory_per_rank(model, optimizer) | {"activations": counter.bytes}
            optimizer.zero_grad(set_to_none=True)
            seconds.append(time.perf_counter() - start)
        ranks = parallel.all_gather_object(memory | {"step_s": statistics.median(seconds[1:] or seconds)})
        if env.is_main:
            Path(args.out).write_text(json.dumps({"strategy": layout.strategy, "layout": layout.describe(),
                                                  "ac": args.ac, "ranks": ranks}, indent=1))
    finally:
        parallel.teardown()


if __name__ == "__main__":
    main()
