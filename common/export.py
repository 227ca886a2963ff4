"""Export a model to ONNX, and check onnxruntime's outputs against PyTorch's.

    python -m common.export --run RUN_DIR [--out PATH] [--samples N]
    python -m common.export --paper vit [--flavor tiny] [--dataset digits] [--out model.onnx] [--samples N]

The graph comes from torch.onnx.export's dynamo exporter with a dynamic batch
axis. A paper that reads padded batches (`padded_batches`) also gets dynamic
height and width (in multiples of the patch size) or sequence length: its image
model takes `images` (B, C, H, W) of one size per batch, its sequence model `x`
(B, T, F) and `lengths` (B,). A paper that reads one size keeps the data set's
size: `images` (B, C, H, W) or `x` (B, T, F). onnxruntime (CPU) then runs two
batch sizes (at two sizes, with different lengths within a batch, where sizes
vary) and every output must equal PyTorch's within 1e-4; a larger difference is
an error and the file is removed. The dataset's preprocessing (layout, colour mode, size,
scale, mean, std, label names) is stored in the file's metadata under
"paper_study", for common.predict. `--samples N` also writes N test images as
PNG files to try it on.
"""

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch.export import Dim

from common.config import TrainConfig, resolve, validate
from common.errors import ConfigError
from common.pretrained import build_model
from common.data import get_dataset
from common.tracking import git_commit
from papers import get_paper

TOLERANCE = 1e-4
EXAMPLE_STEPS = 8  # sequence length of the example and checked inputs (and about 1.5x it)
META_KEY = "paper_study"


class ExportError(RuntimeError):
    """onnxruntime's outputs differ from PyTorch's by more than TOLERANCE."""


# ---------------------------------------------------------------- models and inputs


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Perturb every parameter and batch-norm statistic, so that a check with random weights cannot
    pass on a trivially zero output (the heads start at zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if not t.is_floating_point():
                continue
            noise = 0.1 * torch.randn(t.shape, generator=g)
            t.copy_(1 + noise.abs() if name.endswith("running_var") else t + noise)
    return model


def load_run(run_dir: Path) -> tuple[nn.Module, TrainConfig]:
    """A finished run's model with its final weights (model.safetensors), and its config."""
    from safetensors.torch import load_file

    config, weights = run_dir / "config.json", run_dir / "model.safetensors"
    if not config.is_file():
        raise ConfigError(f"{run_dir} is not a run directory: it has no config.json")
    if not weights.is_file():
        raise ConfigError(f"{run_dir} has no model.safetensors: only a finished run exports (--resume it to the end)")
    cfg = TrainConfig.from_dict(json.loads(config.read_text()))
    facts = get_dataset(cfg.dataset).facts(data_dir=cfg.data_dir, image_size=cfg.image_size)
    model = build_model(get_paper(cfg.paper), cfg.flavor, cfg.init, facts)
    model.load_state_dict(load_file(weights))
    return model.eval(), cfg


def size_multiple(model: nn.Module, preprocess: dict | None) -> int:
    """Image sides must be multiples of this: the model's (ViT's patch) and the dataset's."""
    return math.lcm(getattr(model, "input_multiple", 1), (preprocess or {}).get("size_multiple", 1))


def example(kind: str, facts: dict, multiple: int, batch: int, larger: bool, seed: int,
            padded: bool = True) -> dict[str, torch.Tensor]:
    """Random inputs: images at the dataset's size (or about 1.5x it), or sequences of that many
    steps (the data set's length, or EXAMPLE_STEPS) with lengths from 1 to T (the first one full
    length). padded=False: the data set's size, and no lengths."""
    g = torch.Generator().manual_seed(seed)
    grow = lambda n: multiple * math.ceil((3 * n // 2 if larger and padded else n) / multiple)
    if kind == "image":
        H, W = (facts["img_size"],) * 2 if isinstance(facts["img_size"], int) else facts["img_size"]
        return {"images": torch.randn(batch, facts["in_chans"], grow(H), grow(W), generator=g)}
    T = grow(facts.get("seq_len", EXAMPLE_STEPS))
    x = torch.randn(batch, T, facts["input_size"], generator=g)
    if not padded:
        return {"x": x}
    lengths = torch.randint(1, T + 1, (batch,), generator=g)
    lengths[0] = T
    return {"x": x, "lengths": lengths}


def dynamic_shapes(kind: str, multiple: int, padded: bool = True) -> dict:
    """The batch axis, and where the model reads padded batches, the sides or the length."""
    batch = Dim("batch", min=1, max=1 << 16)
    if not padded:
        return {"images" if kind == "image" else "x": {0: batch}}
    if kind == "image":
        side = lambda name: Dim(name, min=1, max=1 << 14) if multiple == 1 else multiple * Dim(
            f"{name}_over_{multiple}", min=1, max=(1 << 14) // multiple)
        return {"images": {0: batch, 2: side("height"), 3: side("width")}}
    return {"x": {0: batch, 1: Dim("steps", min=1, max=1 << 16)}, "lengths": {0: batch}}


# ---------------------------------------------------------------- export and check


def export(model: nn.Module, kind: str, facts: dict, path: Path, metadata: dict, multiple: int = 1,
           padded: bool = True) -> Path:
    """Write model.onnx (opset of torch.onnx's dynamo exporter) with dynamic axes and the metadata."""
    model.eval()
    inputs = example(kind, facts, multiple, batch=2, larger=False, seed=0, padded=padded)
    with warnings.catch_warnings():  # x and lengths share the batch axis, which torch.onnx warns about
        warnings.filterwarnings("ignore", message="# The axis name")
        program = torch.onnx.export(model, (), kwargs=inputs, dynamo=True, input_names=list(inputs),
                                    dynamic_shapes=dynamic_shapes(kind, multiple, padded), output_names=["output"],
                                    verbose=False)
    program.model.metadata_props[META_KEY] = json.dumps(metadata)
    path.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(path))
    return path


def session(path: Path, threads: int | None = None, spin: bool = True):
    """An onnxruntime CPU session. spin=False stops its threads from spinning after each call (they
    would take the cores from whatever runs next, which matters when timing side by side)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@torch.no_grad()
def check(path: Path, model: nn.Module, kind: str, facts: dict, multiple: int = 1,
          padded: bool = True) -> list[tuple[str, float]]:
    """onnxruntime against PyTorch on batches of 1 and 5, at two sizes where the model reads padded
    batches: [(what, max |diff|)]. Raises ExportError where a difference exceeds TOLERANCE, times the
    largest output magnitude where that exceeds 1."""
    ort_session, report, scales = session(path), [], []
    for batch in (1, 5):
        for larger in (False, True) if padded else (False,):
            inputs = example(kind, facts, multiple, batch, larger, seed=1 + batch + larger, padded=padded)
            expected = model.eval()(*inputs.values()).numpy()
            got = ort_session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
            shape = "x".join(map(str, inputs["images"].shape[2:])) if kind == "image" else \
                f"T={inputs['x'].shape[1]}" + (f", lengths {inputs['lengths'].tolist()}" if padded else "")
            diff = float(np.abs(got - expected).max()) if got.shape == expected.shape else math.inf
            report.append((f"batch {batch}, {shape}", diff))
            scales.append(max(1.0, float(np.abs(expected).max())))  # float32 rounding grows with the outputs
    if any(d > TOLERANCE * s for (_, d), s in zip(report, scales)):
        raise ExportError(f"{path}: onnxruntime differs from PyTorch by more than {TOLERANCE:g} (times the largest "
                          "output where above 1): " + "; ".join(f"{w}: {d:.3g}" for w, d in report))
    return report


def write_samples(out_dir: Path, test_set, preprocess: dict, n: int) -> list[Path]:
    """The first n test samples as PNG files named <index>_<label>.png, pixels undoing the preprocessing."""
    from PIL import Image

    out_dir.mkdir(parents=True, exist_ok=True)
    mean, std = (np.array(preprocess[k], dtype=np.float32)[:, None, None] for k in ("mean", "std"))
    paths = []
    for i in range(min(n, len(test_set))):
        x, y = test_set[i]
        x = x.numpy()[None] if preprocess["layout"] == "rows" else x.numpy()  # (C, H, W)
        pixels = np.clip(np.rint((x * std + mean) / preprocess["scale"]), 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels[0] if preprocess["mode"] == "L" else pixels.transpose(1, 2, 0))
        paths.append(out_dir / f"{i:03d}_{preprocess['labels'][int(y)]}.png")
        image.save(paths[-1])
    return paths


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m common.export", description=__doc__.split("\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="a finished run directory: its config and final weights")
    source.add_argument("--paper", help="a paper's model with random weights")
    p.add_argument("--flavor", default="tiny", help="with --paper (default tiny)")
    p.add_argument("--dataset", help="with --paper: the data it is built for (default: the paper's)")
    p.add_argument("--data-dir", help="with --paper, for data sets read from a folder")
    p.add_argument("--image-size", type=int, help="with --paper, for resizable data sets")
    p.add_argument("--out", help="the ONNX file (default RUN_DIR/model.onnx, or model.onnx)")
    p.add_argument("--samples", type=int, default=0, help="also write N test images next to it, in samples/")
    args = p.parse_args(argv)
    try:
        if args.run:
            model, cfg = load_run(Path(args.run))
            out, run_id = Path(args.out or Path(args.run) / "model.onnx"), Path(args.run).name
        else:  # the trainer's checks: paper, flavor, dataset, inputs, data present, sizes
            flags = dict(paper=args.paper, flavor=args.flavor, dataset=args.dataset, data_dir=args.data_dir,
                         image_size=args.image_size)
            cfg = resolve({k: v for k, v in flags.items() if v is not None})
            validate(cfg)
            out, run_id = Path(args.out or "model.onnx"), None
        spec, data = get_paper(cfg.paper), get_dataset(cfg.dataset)
        facts = data.facts(data_dir=cfg.data_dir, image_size=cfg.image_size)
        preprocess = data.preprocess(data_dir=cfg.data_dir, image_size=cfg.image_size) if data.preprocess else None
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.run:
        torch.manual_seed(0)
        model = randomize(spec.build_for_data(cfg.flavor, facts).eval())
    if getattr(model, "onnx_refusal", None):  # a model says why torch.onnx cannot take it
        print(f"error: {cfg.paper} does not export to ONNX: {model.onnx_refusal}", file=sys.stderr)
        return 2
    multiple, padded = size_multiple(model, preprocess), spec.padded_batches
    inputs = list(example(spec.inputs, facts, multiple, 1, False, 0, padded))
    metadata = dict(paper=cfg.paper, flavor=cfg.flavor, dataset=cfg.dataset, task=data.task, run_id=run_id,
                    commit=git_commit(), inputs=inputs, size_multiple=multiple, preprocess=preprocess)
    export(model, spec.inputs, facts, out, metadata, multiple, padded)
    try:
        report = check(out, model, spec.inputs, facts, multiple, padded)
    except ExportError as e:
        out.unlink()
        print(f"error: {e}; {out} removed", file=sys.stderr)
        return 1
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB): {cfg.paper} {cfg.flavor} for {cfg.dataset}, inputs "
          f"{', '.join(metadata['inputs'])}")
    for what, diff in report:
        print(f"  onnxruntime vs PyTorch, {what}: max |diff| {diff:.2e}")
    worst = max(d for _, d in report)
    print(f"  largest {worst:.2e} <= {TOLERANCE:g}" if worst <= TOLERANCE else
          f"  largest {worst:.2e}, within {TOLERANCE:g} times the largest output")
    if args.samples:
        if preprocess is None:
            print(f"--samples: {cfg.dataset} holds no images; none written", file=sys.stderr)
        else:
            try:
                test_set = data.read(cfg.data_dir, cfg.image_size)[1]
            except ConfigError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            paths = write_samples(out.parent / "samples", test_set, preprocess, args.samples)
            print(f"  {len(paths)} test images in {out.parent / 'samples'}/ (named index_label.png)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
