"""What a strategy holds on each rank and how long its step takes: one layout of row h of common.bench,
run under torchrun (`python -m common.bench --rows h` launches one per layout).

    torchrun --nproc_per_node 4 -m common.bench_memory --paper gpt --flavor GPT-2-124M --block 256 \\
        --dp-shard 2 --tp 2 --ac full --out h.json
    torchrun --nproc_per_node 4 -m common.bench_memory --paper vit --flavor ViT-B/16 --dp-replicate 2 \\
        --pp 2 --pp-schedule gpipe --out h.json

Each rank trains a few steps on random data of the model's kind (token ids, or images) at a global batch
split between the data-parallel ranks (with --pp, through the stages in --microbatches pieces), made
ready by the trainer's own `common.parallelize.parallelize` and stepped as the trainer steps it
(common.step; AdamW from common.optim), and reports, per rank, the bytes of parameters, gradients,
AdamW's state and the activations a forward keeps for backward, and the median seconds of the steps
after the first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from common.choices import AC_MODES, PP_SCHEDULES

# torch and the trainer's pieces are imported in the functions that use them: --help imports no torch


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


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    import torch

    from common import parallel
    from common.optim import build_optimizer
    from common.parallelize import Options, lay_out, parallelize
    from common.tasks import get_task
    from papers import get_paper

    env = parallel.setup()
    try:
        strategy, layout, device_mesh = lay_out(args, env)
        spec = get_paper(args.paper)
        torch.manual_seed(0)
        model = spec.build(args.flavor)
        task = get_task("language-modeling" if hasattr(model, "vocab_size") else "classification")
        inputs, targets = batch(model, args, args.batch // layout.dp, seed=layout.dp_rank(env.rank))
        inputs, targets = inputs.to(env.device), targets.to(env.device)
        # the Trainer's own path: stages, tensor parallel, --ac, the wrapping, and the step that runs on them
        run = parallelize(model, spec, env, strategy, layout, device_mesh, Options.of(args), task)
        optimizer = build_optimizer(parallel.unwrap(run.model), 1e-4, 0.0)
        seconds, memory = [], None
        for _ in range(args.steps):
            start = time.perf_counter()
            run.forward_backward(inputs, targets, saved=run.saved)  # (a pipeline's interleaved: their peak)
            run.sync_shared_gradients()
            optimizer.step()
            if memory is None:  # gradients and AdamW's state both exist now
                memory = parallel.memory_per_rank(run.model, optimizer) | {"activations": run.saved.bytes}
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
