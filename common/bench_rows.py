"""The rows of the bench (common.bench, whose docstring says what each compares): each a function
(args, device) -> table rows, for the papers in args.papers.
"""

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn

from common.config import resolve
from common.data import get_dataset
from common.data.collate import to_device
from common.tasks import call, get_task
from papers import get_paper, list_papers

ROOT = Path(__file__).resolve().parent.parent


def benched() -> list[str]:
    """The papers the rows can time: all but detection's (their targets are lists of boxes)."""
    return [n for n in list_papers() if get_paper(n).task != "detection"]


# ---------------------------------------------------------------- timing


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds(fn, n: int, device: torch.device) -> float:
    """Seconds per call of fn, over n calls."""
    sync(device)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync(device)
    return (time.perf_counter() - start) / n


WARM = True  # --smoke: no warm-up calls
BATCH = 64  # rows d and e's batch; --smoke: 4 (only that each row runs: bf16 without the CPU's support is slow)


def alternate(a, b, repeats: int) -> tuple[float, float, float]:
    """(median of a, median of b, median of the ratios a/b); a and b return one measurement each.

    After a warm-up of both, repeats run in the order a b, b a, a b, ... so that neither
    always runs first."""
    if WARM:
        a(), b()
    pairs = []
    for i in range(repeats):
        if i % 2:
            y, x = b(), a()
        else:
            x, y = a(), b()
        pairs.append((x, y))
    return (statistics.median(x for x, _ in pairs), statistics.median(y for _, y in pairs),
            statistics.median(x / y for x, y in pairs))


def rotate(fns: list, repeats: int) -> tuple[list[float], list[float]]:
    """Like `alternate` for several measurements: each repeat runs them in a rotated order
    (0 1 2, 1 2 0, 2 0 1, ...). Returns the median of each, and the median of each one's
    per-repeat ratio to the last."""
    for fn in fns if WARM else ():
        fn()
    times = [[] for _ in fns]
    for i in range(repeats):
        for j in [(i + k) % len(fns) for k in range(len(fns))]:
            times[j].append(fns[j]())
    return ([statistics.median(t) for t in times],
            [statistics.median(a / b for a, b in zip(t, times[-1])) for t in times])


def row(name: str, what: str, a: str, b: str, ratio: float, target: str = "", met: bool | None = None) -> dict:
    return {"row": name, "comparison": what, "A": a, "B": b, "ratio A/B": f"{ratio:.3f}", "target": target,
            "met": "" if met is None else ("yes" if met else "no")}


# ---------------------------------------------------------------- a training step of any model


def train_step_fn(model: nn.Module, inputs, targets, task, precision: str = "fp32"):
    """One training step (forward, loss, backward, AdamW step) as a closure."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    dtype = torch.bfloat16 if precision == "bf16" else None
    device = targets.device

    def step():
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = task.loss(call(model, inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def default_batch(name: str, batch: int, device: torch.device):
    """(model of the tiny flavor, inputs, targets, task) on the paper's default data set."""
    spec = get_paper(name)
    data, size = get_dataset(spec.defaults["dataset"]), spec.defaults.get("image_size")
    train_set, _ = data.load(image_size=size)
    samples = [train_set[i] for i in range(batch)]
    inputs, targets = to_device(data.collate(image_size=size)(samples), device)
    facts = data.facts(image_size=size)
    torch.manual_seed(0)
    return spec.build_for_data("tiny", facts).to(device), inputs, targets, get_task(data.task, facts)


# A larger configuration per paper for rows d and e (flavor, its overrides, one sample's shape): ViT at
# 32x32 with 64 patches, ResNet-20, an LSTM of 256 cells over 32 steps. Others time their tiny flavor only.
LARGER = {
    "vit": ("tiny/4", dict(img_size=32, in_chans=3), (3, 32, 32)),
    "resnet": ("ResNet-20", {}, (3, 32, 32)),
    "lstm": ("tiny", dict(input_size=8, hidden_size=256), (32, 8)),
}
# The Fashion-MNIST speedrun's model (docs/fashion-mnist.md#a-speedrun), in the same form: ResNet's tiny
# flavor on 28x28 grey images, the step whose compiled and eager speeds the speedrun compares.
SPEEDRUN = {"resnet": ("tiny", {}, (1, 28, 28))}


def random_batch(configs: dict):
    """(model, inputs, targets, task) of a paper's configuration in `configs`, on random data."""
    def build(name: str, batch: int, device: torch.device):
        flavor, overrides, shape = configs[name]
        torch.manual_seed(0)
        model, inputs = get_paper(name).build(flavor, **overrides), torch.randn(batch, *shape)
        targets = torch.randint(0, 10, (batch,))
        return model.to(device), inputs.to(device), targets.to(device), get_task("classification")

    return build


def _configs(name: str, quick: bool) -> list:
    others = [] if quick else [(label, random_batch(configs)) for label, configs in
                                (("larger", LARGER), ("fashion-mnist speedrun", SPEEDRUN)) if name in configs]
    return [("tiny", default_batch)] + others


# ---------------------------------------------------------------- rows


def _run_loop(paper: str, nproc: int, steps: int, repeats: int, skips: list[str]) -> dict:
    """common.bench_loop's measurements of one paper on `nproc` processes (torchrun for several; in this
    process for one): {configuration: [samples/s per repeat]}."""
    flags = ["--paper", paper, "--steps", str(steps), "--repeats", str(repeats), "--skips", ",".join(skips)]
    flags += [] if WARM else ["--no-warm-up"]
    if nproc == 1:
        import contextlib
        import io

        from common import bench_loop

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            bench_loop.main(flags)
        return json.loads(out.getvalue().strip().splitlines()[-1])
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master-port",
                str(_free_port())]
    done = subprocess.run(launcher + ["-m", "common.bench_loop", *flags], check=True, capture_output=True, text=True,
                          cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


LOOP_SKIPS = ("agree", "activations", "train-metric")  # what the trainer adds to a step, switched off in turn


def row_a(args, device) -> list[dict]:
    """The trainer's samples/s against a bare loop's on the same model, data, batch and optimizer, in one
    process and in 2-process DDP (common.bench_loop); outside --quick, also the trainer with each per-step
    feature switched off against the whole trainer."""
    out = []
    for name in args.papers:
        batch = resolve({"paper": name}).batch_size
        for nproc in (1, 2):
            skips = [] if args.quick else list(LOOP_SKIPS)
            runs = _run_loop(name, nproc, args.steps, args.repeats, skips)
            median = {k: statistics.median(v) for k, v in runs.items()}
            ratio = statistics.median(t / b for t, b in zip(runs["trainer"], runs["bare"]))
            where = "1 process" if nproc == 1 else f"{nproc} processes (ddp)"
            out.append(row("a", f"{name}: trainer vs bare loop, {where}, samples/s ({args.steps} steps, batch "
                                f"{batch})", f"{median['trainer']:,.0f}", f"{median['bare']:,.0f}", ratio,
                           ">= 0.97", ratio >= 0.97))
            for skip in skips:
                off = runs[f"trainer -{skip}"]
                ratio = statistics.median(t / o for t, o in zip(runs["trainer"], off))
                out.append(row("a", f"{name}: trainer vs trainer without {skip}, {where}, samples/s",
                               f"{median['trainer']:,.0f}", f"{statistics.median(off):,.0f}", ratio))
    return out


def _total(out) -> torch.Tensor:
    """One scalar of every output a model gives in training (auxiliary classifiers' too), to backpropagate."""
    if getattr(out, "logits", None) is not None:  # transformers' ModelOutput (a dict, without "aux")
        return out.logits.sum()
    if hasattr(out, "to_tuple"):  # one of several heads (BertForPreTraining's prediction and NSP logits)
        return sum(t.sum() for t in out.to_tuple() if torch.is_tensor(t))
    if isinstance(out, dict):  # ours: {"logits": ..., "aux": [(logits, weight), ...]}
        return out["logits"].sum() + sum(a.sum() for a, _ in out["aux"])
    if isinstance(out, tuple):  # torchvision's GoogLeNetOutputs
        return sum(t.sum() for t in out if t is not None)
    return out.sum()


def row_b(args, device) -> list[dict]:
    """Forward+backward time of our models against the reference implementations (each paper's
    PaperSpec.reference_models: timm, torchvision, transformers), same configuration and weights."""
    from functools import partial

    from common.pretrained import SOURCES, parse_init

    out = []
    for name in args.papers:
        spec = get_paper(name)
        for ref in spec.reference_models[: 1 if args.quick else None]:
            if ref.build is None:  # an --init source
                source, arch, _ = parse_init(ref.ref)
            else:  # one that only the bench builds ("transformers:GPT2LMHeadModel")
                source, arch = ref.ref.split(":", 1)
            build = ref.build or partial(SOURCES[source], arch, pretrained=False)
            torch.manual_seed(0)
            theirs = build(**ref.kwargs)
            ours = (ref.load or spec.pretrained[source])(theirs)
            ours, theirs = ours.to(device).train(), theirs.to(device).train()
            if spec.inputs == "tokens":  # (B, T) token ids
                x = torch.randint(ours.vocab_size, ref.shape, device=device)
                size = f"{ref.shape[1]} tokens"
            else:
                x = torch.randn(*ref.shape, device=device)
                size = "x".join(map(str, ref.shape[2:]))
            o, r, ratio = alternate(lambda: seconds(lambda: _total(ours(x)).backward(), args.iters, device),
                                    lambda: seconds(lambda: _total(theirs(x)).backward(), args.iters, device),
                                    args.repeats)
            out.append(row("b", f"{name} vs {source} {arch}, {size}: forward+backward, batch {ref.shape[0]}",
                           f"{o * 1e3:.2f} ms", f"{r * 1e3:.2f} ms", ratio, "<= 1.05", ratio <= 1.05))
    return out


def row_c(args, device) -> list[dict]:
    """Our LSTM (gate equations in Python) against torch.nn.LSTM's fused kernel."""
    if "lstm" not in args.papers:
        return []
    from papers.lstm import from_torch

    ref = nn.LSTM(8, 128, batch_first=True).to(device)
    ours = from_torch(ref).to(device)
    x = torch.randn(64, 8, 8, device=device)
    out = []
    for label, model in [("eager", ours), ("compiled", torch.compile(ours, backend=args.backend))]:
        o, r, ratio = alternate(lambda: seconds(lambda: model(x)[0].sum().backward(), args.iters, device),
                                lambda: seconds(lambda: ref(x)[0].sum().backward(), args.iters, device), args.repeats)
        out.append(row("c", f"lstm ours {label} vs nn.LSTM (eager): forward+backward, batch 64, 8 steps, 128 cells",
                       f"{o * 1e3:.2f} ms", f"{r * 1e3:.2f} ms", ratio))
    return out


def _throughput_row(name, label, build, args, device, a_kwargs, b_kwargs, what):
    model_a, inputs, targets, task = build(name, BATCH, device)
    model_b = _copy(model_a)
    if a_kwargs.get("compile"):
        model_a.compile(backend=args.backend)
    step_a = train_step_fn(model_a, inputs, targets, task, a_kwargs.get("precision", "fp32"))
    step_b = train_step_fn(model_b, inputs, targets, task, b_kwargs.get("precision", "fp32"))
    start = time.perf_counter()
    step_a()  # compiles, if it does
    first = time.perf_counter() - start
    a, b, ratio = alternate(lambda: BATCH / seconds(step_a, args.iters, device),
                            lambda: BATCH / seconds(step_b, args.iters, device), args.repeats)
    note = f" (first step {first:.1f} s)" if a_kwargs.get("compile") else ""
    return row(what[0], f"{name} {label}: {what[1]}, samples/s{note}", f"{a:,.0f}", f"{b:,.0f}", ratio)


def _copy(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model)


def row_d(args, device) -> list[dict]:
    out = []
    for name in args.papers:
        for label, build in _configs(name, args.quick):
            out.append(_throughput_row(name, label, build, args, device, {"compile": True}, {},
                                       ("d", f"compiled ({args.backend}) vs eager training")))
    return out


def row_e(args, device) -> list[dict]:
    out = []
    for name in args.papers:
        for label, build in _configs(name, args.quick):
            out.append(_throughput_row(name, label, build, args, device, {"precision": "bf16"}, {},
                                       ("e", f"bf16 autocast vs fp32 training on {device.type}")))
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_train(flags: list[str], nproc: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master-port",
                     str(_free_port())] if nproc > 1 else [sys.executable])
        subprocess.run(launcher + [str(ROOT / "train.py"), *flags, "--wandb", "disabled", "--out", f"{tmp}/run"],
                       check=True, capture_output=True, cwd=tmp)
        return json.loads(Path(f"{tmp}/run/result.json").read_text())


def row_f(args, device) -> list[dict]:
    out = []
    for name in args.papers:
        flags = ["--paper", name, "--max-steps", str(args.steps)]
        runs = {"single": [], "ddp": [], "fsdp": []}
        if not args.quick:
            _run_train(flags, 1)  # warm the file cache
        for _ in range(args.repeats if not args.quick else 1):
            runs["single"].append(_run_train(flags, 1))
            runs["ddp"].append(_run_train(flags + ["--strategy", "ddp"], 2))
            runs["fsdp"].append(_run_train(flags + ["--strategy", "fsdp"], 2))
        rate = {k: statistics.median(r["samples_per_s"] for r in v) for k, v in runs.items()}
        mem = {k: max(m["total"] for m in v[0]["memory_per_rank"]) for k, v in runs.items()}
        pairs = list(zip(runs["ddp"], runs["single"]))
        out.append(row("f", f"{name}: ddp 2 processes vs 1 process, samples/s at global batch "
                            f"{runs['single'][0]['batch_size']}", f"{rate['ddp']:,.0f}", f"{rate['single']:,.0f}",
                       statistics.median(d["samples_per_s"] / s["samples_per_s"] for d, s in pairs)))
        pairs = list(zip(runs["fsdp"], runs["ddp"]))
        out.append(row("f", f"{name}: fsdp vs ddp (2 processes), samples/s", f"{rate['fsdp']:,.0f}",
                       f"{rate['ddp']:,.0f}", statistics.median(f["samples_per_s"] / d["samples_per_s"] for f, d in pairs)))
        out.append(row("f", f"{name}: fsdp vs ddp, bytes per rank (params, grads, AdamW state)",
                       f"{mem['fsdp']:,}", f"{mem['ddp']:,}", mem["fsdp"] / mem["ddp"]))
    return out


def _onnx_session(model: nn.Module, spec, facts: dict, threads: int, folder: str):
    """model exported to ONNX as common.export exports it (dynamic sides only for a paper that reads
    padded batches) and checked against PyTorch, in an onnxruntime session with `threads` threads that
    do not spin between calls (spinning threads slow down the next measurement)."""
    from common import export

    path = Path(folder) / "model.onnx"
    multiple = export.size_multiple(model, None)
    _quiet(export.export, model, spec.inputs, facts, path, {}, multiple, spec.padded_batches)
    export.check(path, model, spec.inputs, facts, multiple, spec.padded_batches)
    return export.session(path, threads, spin=False)


def _onnx_feed(inputs, session) -> dict:
    """The exported graph's inputs (as common.export names them) for a batch of the default data set:
    images, token ids, sequences and their lengths, or a dict's entries (source and target ids)."""
    if isinstance(inputs, dict):
        feed = dict(inputs)
    elif inputs.dim() == 4:
        feed = {"images": inputs}
    elif not inputs.is_floating_point():
        feed = {"idx": inputs}
    else:
        feed = {"x": inputs, "lengths": torch.full((inputs.shape[0],), inputs.shape[1])}
    return {name: feed[name].numpy() for name in (i.name for i in session.get_inputs())}


def row_g(args, device) -> list[dict]:
    """Inference latency: compiled and onnxruntime (CPU only, the same thread count) against eager."""
    out, threads = [], torch.get_num_threads()
    for name in args.papers:
        spec = get_paper(name)
        with tempfile.TemporaryDirectory() as folder:
            session = None
            if device.type == "cpu":
                model, _, _, _ = default_batch(name, 1, device)
                facts = get_dataset(spec.defaults["dataset"]).facts(image_size=spec.defaults.get("image_size"))
                session = _onnx_session(model.eval(), spec, facts, threads, folder)
            for batch in (1,) if args.smoke else (1, 32):
                model, inputs, _, _ = default_batch(name, batch, device)
                model.eval()
                compiled = _copy(model)
                compiled.compile(backend=args.backend)
                timed = {"compiled": lambda: seconds(lambda: call(compiled, inputs), args.iters, device)}
                if session is not None:
                    feed = _onnx_feed(inputs, session)
                    timed[f"onnxruntime ({threads} threads, as torch)"] = lambda: seconds(
                        lambda: session.run(None, feed), args.iters, device)
                timed["eager"] = lambda: seconds(lambda: call(model, inputs), args.iters, device)
                with torch.no_grad():
                    call(compiled, inputs)  # compiles
                    medians, ratios = rotate(list(timed.values()), args.repeats)
                for what, t, ratio in list(zip(timed, medians, ratios))[:-1]:
                    out.append(row("g", f"{name} tiny: inference latency, batch {batch}: {what} vs eager",
                                   f"{t * 1e3:.3f} ms", f"{medians[-1] * 1e3:.3f} ms", ratio))
    return out


# Row h: the models and the layouts of 4 processes it compares (common.bench_memory runs one each).
MEMORY_MODELS = {"GPT-2-124M": ("gpt", "GPT-2-124M"), "ViT-B/16": ("vit", "ViT-B/16")}
MEMORY_LAYOUTS = {
    "ddp": [],
    "fsdp": ["--strategy", "fsdp"],
    "tp 2 x dp 2": ["--dp-replicate", "2", "--tp", "2"],
    "fsdp 2 x tp 2": ["--dp-shard", "2", "--tp", "2"],
    "hsdp 2 x 2": ["--dp-replicate", "2", "--dp-shard", "2"],
    "pp 2 x dp 2, gpipe": ["--dp-replicate", "2", "--pp", "2", "--pp-schedule", "gpipe"],
    "pp 2 x dp 2, 1f1b": ["--dp-replicate", "2", "--pp", "2", "--pp-schedule", "1f1b"],
}


def _memory_run(flags: list[str], nproc: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master-port",
                        str(_free_port()), "-m", "common.bench_memory", *flags, "--out", f"{tmp}/h.json"],
                       check=True, capture_output=True, cwd=ROOT)
        return json.loads(Path(f"{tmp}/h.json").read_text())


def row_h(args, device) -> list[dict]:
    """Per rank: the bytes of parameters, gradients, AdamW's state and saved activations, and the step time
    against ddp's, for each layout of 4 processes, with and without --ac full (GPT-2 at 256 positions)."""
    out = []
    models = {"tiny GPT": ("gpt", "tiny"), "tiny ViT": ("vit", "tiny")} if args.quick else MEMORY_MODELS
    for label, (paper, flavor) in models.items():
        base = ["--paper", paper, "--flavor", flavor, "--block", "256" if not args.quick else "64",
                "--batch", "4", "--steps", str(max(2, min(args.steps, 3)))]
        ddp = None
        for ac in ("none", "full"):
            for layout, flags in MEMORY_LAYOUTS.items():
                run = _memory_run(base + flags + ["--ac", ac], 4)
                most = {k: max(r[k] for r in run["ranks"]) for k in ("params", "grads", "optimizer", "activations")}
                step = statistics.median(r["step_s"] for r in run["ranks"])
                ddp = ddp or (most, step)
                out.append({"row": "h", "model": label, "layout": f"{layout}" + (", ac full" if ac == "full" else ""),
                            **{f"{k} bytes/rank": f"{v:,}" for k, v in most.items()},
                            "params vs ddp": f"{most['params'] / ddp[0]['params']:.2f}",
                            "activations vs ddp": f"{most['activations'] / ddp[0]['activations']:.2f}",
                            "step time vs ddp": f"{step / ddp[1]:.2f}"})
    return out


def row_i(args, device) -> list[dict]:
    """The loader's samples/s (imagefolder, wds, hf; 0, 1, 2 workers) against each image paper's training
    samples/s on batches of the same images (its tiny model on random data of their shape)."""
    from common import bench_loader

    b, side = bench_loader.BATCH, bench_loader.SIZE
    models = {}
    for name in [n for n in args.papers if get_paper(n).inputs == "image"]:
        torch.manual_seed(0)
        model = get_paper(name).build_for_data("tiny", dict(num_classes=10, in_chans=3, img_size=side)).to(device)
        inputs, targets = torch.randn(b, 3, side, side, device=device), torch.randint(0, 10, (b,), device=device)
        step = train_step_fn(model, inputs, targets, get_task("classification"))
        if WARM:
            step()
        models[name] = statistics.median(b / seconds(step, args.iters, device) for _ in range(args.repeats))
    return bench_loader.rows(models, args.repeats, args.steps, 320 if args.smoke else bench_loader.IMAGES)


def _quiet(fn, *a):
    import contextlib
    import io
    import os

    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(io.StringIO()):
        return fn(*a)



ROWS = {"a": row_a, "b": row_b, "c": row_c, "d": row_d, "e": row_e, "f": row_f, "g": row_g, "h": row_h,
        "i": row_i}
