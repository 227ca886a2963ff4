"""Export a model to ONNX, and check onnxruntime's outputs against PyTorch's.

    python -m common.export --run RUN_DIR [--out PATH] [--samples N]
    python -m common.export --paper vit [--flavor tiny] [--dataset digits] [--out model.onnx] [--samples N]

The graph comes from torch.onnx.export's dynamo exporter with a dynamic batch
axis. A paper that reads padded batches (`padded_batches`) also gets dynamic
height and width (in multiples of the patch size) or sequence length: its image
model takes `images` (B, C, H, W) of one size per batch, its sequence model `x`
(B, T, F) and `lengths` (B,). A paper that reads one size keeps the data set's
size: `images` (B, C, H, W) or `x` (B, T, F). A detection model exports its
`detect(images, mask)`: inputs `images` (B, C, H, W) and `mask` (B, H, W) bool,
True on each image's valid pixels (images of different sizes share one padded
batch), outputs `boxes` (B, N, 4) x1 y1 x2 y2 in pixels, `scores` (B, N) and
`labels` (B, N), N fixed by the model; a detection model that torch.onnx cannot
take says why in its `onnx_refusal`, and is refused in one line. A segmentation
model exports its class scores for every pixel, `scores` (B, K, H, W) (its
"out"), with dynamic height and width where it reads padded batches. onnxruntime
(CPU) then runs two batch sizes (at two sizes, with different lengths or image
sizes within a batch, where sizes vary) and every output must equal PyTorch's
within 1e-4 (integer outputs exactly); a larger difference is an error and the
file is removed. A LoRA run (--lora) exports with its update merged into the
weights it adapts (papers.lora.merge_lora), checked against the unmerged model.
The dataset's preprocessing (layout, colour mode, size, scale, mean, std, label
names) and the graph's inputs and outputs are stored in the file's metadata
under "paper_study", for common.predict. `--samples N` also writes N test
images as PNG files to try it on.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import math
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from common.config import TrainConfig, check_model_kwargs, describe_kwargs, resolve, validate
from common.errors import ConfigError
from common.tracking import git_commit
from papers import get_paper

# Nothing above imports torch (nor numpy): --help and a mistyped flag are answered at once. torch, the
# data sets and the models are imported by the functions that use them.
if TYPE_CHECKING:
    import numpy as np
    import torch
    import torch.nn as nn

TOLERANCE = 1e-4
EXAMPLE_STEPS = 8  # sequence length of the example and checked inputs (and about 1.5x it)
META_KEY = "paper_study"
DETECTIONS = ["boxes", "scores", "labels"]  # a detection model's outputs (see Detector)
SEGMENTATION = ["scores"]  # a segmentation model's class scores of every pixel (see Segmenter)


class ExportError(RuntimeError):
    """onnxruntime's outputs differ from PyTorch's by more than TOLERANCE."""


# ---------------------------------------------------------------- models and inputs


@functools.cache
def detector_class() -> type[nn.Module]:
    """The class Detector, defined on first use (it is an nn.Module, and this module imports torch only
    where it is needed)."""
    import torch.nn as nn

    class Detector(nn.Module):
        """A detection model as its ONNX file runs it: `detect(images, mask)`, the fixed-shape tensors
        boxes (B, N, 4) x1 y1 x2 y2 in each image's pixels, scores (B, N) and labels (B, N), where
        forward gives a list of per-image dicts (which torch.export cannot return for a dynamic batch).

        Args:
            model: a detection model with `detect(images, mask)` (DETR's).
        """

        def __init__(self, model: nn.Module):
            super().__init__()
            if not callable(getattr(model, "detect", None)):
                raise ValueError(f"{type(model).__name__} has no detect(images, mask) giving boxes, scores and "
                                 "labels as tensors of fixed shape, which an ONNX graph returns")
            self.model = model

        def forward(self, images: torch.Tensor, mask: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return self.model.detect(images, mask)

    return Detector


@functools.cache
def segmenter_class() -> type[nn.Module]:
    """The class Segmenter, defined on first use (as Detector)."""
    import torch.nn as nn

    class Segmenter(nn.Module):
        """A segmentation model as its ONNX file runs it: the class scores (B, K, H, W) of every pixel, the
        model's own or, where it gives torchvision's dict, its "out" (an auxiliary head's are for training)."""

        def __init__(self, model: nn.Module):
            super().__init__()
            self.model = model

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            out = self.model(images)
            return out["out"] if isinstance(out, dict) else out

    return Segmenter


def graph(model: nn.Module, task: str = "") -> nn.Module:
    """The module whose forward the ONNX graph is: the model, for detection its Detector, for segmentation
    its Segmenter."""
    wrapper = {"detection": detector_class, "segmentation": segmenter_class}.get(task)
    return wrapper()(model).train(model.training) if wrapper else model


def output_names(task: str) -> list[str]:
    return {"detection": DETECTIONS, "segmentation": SEGMENTATION}.get(task, ["output"])


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Perturb every parameter and batch-norm statistic, so that a check with random weights cannot
    pass on a trivially zero output (the heads start at zero)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if not t.is_floating_point():
                continue
            noise = 0.1 * torch.randn(t.shape, generator=g)
            t.copy_(1 + noise.abs() if name.endswith("running_var") else t + noise)
    return model


def load_run(run_dir: Path, model_kwargs: dict | None = None) -> tuple[nn.Module, TrainConfig]:
    """A finished run's model with its final weights (model.safetensors), and its config: built with the
    run's --model-kwargs, and `model_kwargs` over them (arguments that change how the trained weights
    compute, not their shapes: a detector's proposals at test time, say; the config returned has them).
    A LoRA run's (--lora) weights are its update and new head alone: they are read onto the model its --init
    gives (common.lora.base_model), and the model comes back unmerged (papers.lora.merge_lora merges it)."""
    from safetensors.torch import load_file

    from common.data import dataset_for, options
    from common.pretrained import build_model

    config, weights = run_dir / "config.json", run_dir / "model.safetensors"
    if not config.is_file():
        raise ConfigError(f"{run_dir} is not a run directory: it has no config.json")
    if not weights.is_file():
        raise ConfigError(f"{run_dir} has no model.safetensors: only a finished run exports (--resume it to the end)")
    cfg = TrainConfig.from_dict(json.loads(config.read_text()))
    spec = get_paper(cfg.paper)
    if model_kwargs:
        cfg = dataclasses.replace(cfg, model_kwargs={**cfg.model_kwargs, **model_kwargs})
        check_model_kwargs(spec, cfg)
    facts = dataset_for(cfg).facts(**options(cfg))
    if cfg.lora is not None:
        from common import lora

        model, fresh = lora.base_model(spec, cfg, facts)
        return lora.load_update(lora.apply(model, cfg, fresh), load_file(weights), weights).eval(), cfg
    try:
        model = build_model(spec, cfg.flavor, cfg.init, facts, cfg.model_kwargs)
        model.load_state_dict(load_file(weights))
    except (ValueError, TypeError, RuntimeError) as e:
        if not model_kwargs:
            raise
        raise ConfigError(f"{run_dir} with --model-kwargs {describe_kwargs(model_kwargs)}: "
                          f"{' '.join(str(e).split())[:300]}") from None
    return model.eval(), cfg


def merged(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    """What the ONNX file holds: a LoRA run's model (--lora) with its update folded into the weights it adapts, a
    copy (papers.lora.merge_lora: the paper's own architecture, which `check` compares with the unmerged model);
    any other model as it is."""
    if cfg.lora is None:
        return model
    from papers.lora import merge_lora

    print(f"LoRA r={cfg.lora} merged into the weights it adapts ({cfg.lora_targets}); onnxruntime is checked "
          f"against the unmerged model")
    return merge_lora(copy.deepcopy(model))


def load_run_of(run_dir: Path, task: str, tool: str) -> tuple[nn.Module, TrainConfig, dict]:
    """`load_run` for a tool that reads one task's runs (`python -m common.<tool>`): the model, its config,
    and its data set's facts; ConfigError when the run trained another task."""
    from common.data import dataset_for, options

    model, cfg = load_run(run_dir)
    data = dataset_for(cfg)
    if data.task != task:
        raise ConfigError(f"{run_dir} trained {cfg.paper} on {cfg.dataset}, a {data.task} data set; "
                          f"{tool} reads {task} runs")
    return model, cfg, data.facts(**options(cfg))


def size_multiple(model: nn.Module, preprocess: dict | None) -> int:
    """Image sides must be multiples of this: the model's (ViT's patch) and the dataset's."""
    return math.lcm(getattr(model, "input_multiple", 1), (preprocess or {}).get("size_multiple", 1))


def example(kind: str, facts: dict, multiple: int, batch: int, larger: bool, seed: int,
            padded: bool = True, detection: bool = False) -> dict[str, torch.Tensor]:
    """Random inputs: images at the dataset's size (or about 1.5x it), or sequences of that many
    steps (the data set's length, or EXAMPLE_STEPS) with lengths from 1 to T (the first one full
    length). padded=False: the data set's size, and no lengths. detection: images in [0, 1] and
    their mask, each image after the first (which fills the batch) of its own height and width,
    from half the batch's to all of it, zero-padded at the bottom and right. pairs: source ids of
    lengths 1 to S (the first full length) padded with pad_id, and a teacher-forced target from <s>."""
    import torch

    g = torch.Generator().manual_seed(seed)
    grow = lambda n: multiple * math.ceil((3 * n // 2 if larger and padded else n) / multiple)
    if kind == "image":
        H, W = (facts["img_size"],) * 2 if isinstance(facts["img_size"], int) else facts["img_size"]
        H, W = grow(H), grow(W)
        if not detection:
            return {"images": torch.randn(batch, facts["in_chans"], H, W, generator=g)}
        mask = torch.zeros(batch, H, W, dtype=torch.bool)
        for i in range(batch):
            h, w = (H, W) if i == 0 else (int(torch.randint(n // 2, n + 1, (), generator=g)) for n in (H, W))
            mask[i, :h, :w] = True
        images = torch.rand(batch, facts["in_chans"], H, W, generator=g) * mask[:, None]
        return {"images": images, "mask": mask}
    if kind == "tokens":  # a block of token ids, its length dynamic in the graph (about 1.5x with larger)
        T = 3 * EXAMPLE_STEPS // 2 if larger else EXAMPLE_STEPS
        return {"idx": torch.randint(0, facts["vocab_size"], (batch, T), generator=g)}
    if kind == "pairs":  # source ids of lengths 1 to S (the first full length), and a teacher-forced target
        S, T = grow(EXAMPLE_STEPS), grow(EXAMPLE_STEPS) - 1
        lengths = torch.randint(1, S + 1, (batch,), generator=g)
        lengths[0] = S
        first = 4 if "itos" in facts else 0  # past <pad> <s> </s> <unk>
        src = torch.randint(first, facts["src_vocab"], (batch, S), generator=g)
        src = src.masked_fill(torch.arange(S) >= lengths[:, None], facts.get("pad_id", 0))
        tgt = torch.randint(first, facts["tgt_vocab"], (batch, T), generator=g)
        tgt[:, 0] = facts.get("bos_id", 1)
        return {"src": src, "src_lengths": lengths, "tgt": tgt}
    T = grow(facts.get("seq_len", EXAMPLE_STEPS))
    x = torch.randn(batch, T, facts["input_size"], generator=g)
    if not padded:
        return {"x": x}
    lengths = torch.randint(1, T + 1, (batch,), generator=g)
    lengths[0] = T
    return {"x": x, "lengths": lengths}


def dynamic_shapes(kind: str, multiple: int, padded: bool = True, detection: bool = False) -> dict:
    """The batch axis, and where the model reads padded batches, the sides (of the mask too, for
    detection) or the length."""
    from torch.export import Dim

    batch = Dim("batch", min=1, max=1 << 16)
    if kind == "tokens":  # a language model reads any length up to its positions
        return {"idx": {0: batch, 1: Dim("steps", min=1, max=1 << 16)}}
    if not padded:
        return {"images" if kind == "image" else "x": {0: batch}, **({"mask": {0: batch}} if detection else {})}
    if kind == "image":
        side = lambda name: Dim(name, min=1, max=1 << 14) if multiple == 1 else multiple * Dim(
            f"{name}_over_{multiple}", min=1, max=(1 << 14) // multiple)
        height, width = side("height"), side("width")
        images = {"images": {0: batch, 2: height, 3: width}}
        return {**images, "mask": {0: batch, 1: height, 2: width}} if detection else images
    if kind == "pairs":
        return {"src": {0: batch, 1: Dim("src_steps", min=1, max=1 << 16)}, "src_lengths": {0: batch},
                "tgt": {0: batch, 1: Dim("tgt_steps", min=1, max=1 << 16)}}
    return {"x": {0: batch, 1: Dim("steps", min=1, max=1 << 16)}, "lengths": {0: batch}}


# ---------------------------------------------------------------- export and check


def export(model: nn.Module, kind: str, facts: dict, path: Path, metadata: dict, multiple: int = 1,
           padded: bool = True, task: str = "") -> Path:
    """Write model.onnx (opset of torch.onnx's dynamo exporter) with dynamic axes and the metadata;
    task "detection": the model's Detector, with a mask input and the outputs boxes, scores and labels;
    "segmentation": its Segmenter, the scores of every pixel."""
    import torch

    model.eval()
    detection = task == "detection"
    inputs = example(kind, facts, multiple, batch=2, larger=False, seed=0, padded=padded, detection=detection)
    with warnings.catch_warnings():  # inputs share the batch axis (and sides), which torch.onnx warns about
        warnings.filterwarnings("ignore", message="# The axis name")
        program = torch.onnx.export(graph(model, task), (), kwargs=inputs, dynamo=True,
                                    input_names=list(inputs), output_names=output_names(task),
                                    dynamic_shapes=dynamic_shapes(kind, multiple, padded, detection), verbose=False)
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


def difference(got: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """max |got - expected| and the most it may be: TOLERANCE, times the largest |expected| where that
    exceeds 1 (float32 rounding grows with the outputs); 0 for integers (labels); inf where the shapes
    or kinds differ."""
    import numpy as np

    integer = np.issubdtype(expected.dtype, np.integer)
    if got.shape != expected.shape or np.issubdtype(got.dtype, np.integer) != integer:
        return math.inf, 0.0
    diff = float(np.abs(got.astype(np.float64) - expected).max())
    return diff, 0.0 if integer else TOLERANCE * max(1.0, float(np.abs(expected).max()))


def check(path: Path, model: nn.Module, kind: str, facts: dict, multiple: int = 1,
          padded: bool = True, task: str = "") -> list[tuple[str, float]]:
    """onnxruntime against PyTorch on batches of 1 and 5, at two sizes where the model reads padded
    batches (for detection, images of different sizes in each padded batch of 5): [(what, max |diff|)],
    the largest over every output. Raises ExportError where a difference exceeds TOLERANCE, times the
    output's largest magnitude where that exceeds 1 (integer outputs, such as labels, must be equal)."""
    import torch

    ort_session, module, report, failed = session(path), graph(model.eval(), task), [], False
    detection = task == "detection"
    for batch in (1, 5):
        for larger in (False, True) if padded or kind == "tokens" else (False,):
            inputs = example(kind, facts, multiple, batch, larger, seed=1 + batch + larger, padded=padded,
                             detection=detection)
            with torch.no_grad():
                expected = module(*inputs.values())
            expected = [t.numpy() for t in (expected if isinstance(expected, tuple) else (expected,))]
            got = ort_session.run(None, {k: v.numpy() for k, v in inputs.items()})
            diffs = ([difference(g, e) for g, e in zip(got, expected)] if len(got) == len(expected)
                     else [(math.inf, 0.0)])
            failed |= any(d > allowed for d, allowed in diffs)
            if kind == "tokens":
                shape = f"T={inputs['idx'].shape[1]}"
            elif kind == "pairs":
                shape = f"S={inputs['src'].shape[1]}, T={inputs['tgt'].shape[1]}, lengths {inputs['src_lengths'].tolist()}"
            elif kind != "image":
                shape = f"T={inputs['x'].shape[1]}" + (f", lengths {inputs['lengths'].tolist()}" if padded else "")
            elif detection:  # each image's valid height x width
                sizes = [f"{int(m.any(1).sum())}x{int(m.any(0).sum())}" for m in inputs["mask"]]
                shape = "x".join(map(str, inputs["images"].shape[2:])) + f", images {' '.join(sizes)}"
            else:
                shape = "x".join(map(str, inputs["images"].shape[2:]))
            report.append((f"batch {batch}, {shape}", max(d for d, _ in diffs)))
    if failed:
        raise ExportError(f"{path}: onnxruntime differs from PyTorch by more than {TOLERANCE:g} (times the largest "
                          "output where above 1; integers exactly): " + "; ".join(f"{w}: {d:.3g}" for w, d in report))
    return report


def write_samples(out_dir: Path, test_set, preprocess: dict, n: int) -> list[Path]:
    """The first n test samples as PNG files named <index>_<label>.png (detection: <index>_<labels>.png,
    its boxes' labels joined by "-", "none" where it has none; segmentation: the classes of its mask but
    the first, the background; a "/" in a label, as Fashion-MNIST's "T-shirt/top", written "_"), pixels
    undoing the preprocessing."""
    import numpy as np
    from PIL import Image

    out_dir.mkdir(parents=True, exist_ok=True)
    mean, std = (np.array(preprocess[k], dtype=np.float32)[:, None, None] for k in ("mean", "std"))
    paths = []
    for i in range(min(n, len(test_set))):
        x, y = test_set[i]
        x = x.numpy()[None] if preprocess["layout"] == "rows" else x.numpy()  # (C, H, W)
        pixels = np.clip(np.rint((x * std + mean) / preprocess["scale"]), 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels[0] if preprocess["mode"] == "L" else pixels.transpose(1, 2, 0))
        ids = y["labels"] if isinstance(y, dict) else [y]
        if getattr(ids, "ndim", 1) == 2:  # a segmentation mask: the classes in it, but the first (background) and void
            ids = [c for c in ids.unique().tolist() if 0 < c < len(preprocess["labels"])]
        names = [preprocess["labels"][int(c)].replace("/", "_") for c in ids]
        paths.append(out_dir / f"{i:03d}_{'-'.join(names) or 'none'}.png")
        image.save(paths[-1])
    return paths


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
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
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from common.data import dataset_for, options

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
        spec, data = get_paper(cfg.paper).for_flavor(cfg.flavor), dataset_for(cfg)
        facts = data.facts(**options(cfg))
        preprocess = data.preprocess(**options(cfg)) if data.preprocess else None
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.run:
        torch.manual_seed(0)
        model = randomize(spec.build_for_data(cfg.flavor, facts).eval())
    if getattr(model, "onnx_refusal", None):  # a model says why torch.onnx cannot take it
        print(f"error: {cfg.paper} does not export to ONNX: {model.onnx_refusal}", file=sys.stderr)
        return 2
    detection = data.task == "detection"
    try:
        graph(model, data.task)
    except ValueError as e:
        print(f"error: {cfg.paper} does not export to ONNX: {e}", file=sys.stderr)
        return 2
    multiple, padded = size_multiple(model, preprocess), spec.padded_batches
    inputs = list(example(spec.inputs, facts, multiple, 1, False, 0, padded, detection))
    metadata = dict(paper=cfg.paper, flavor=cfg.flavor, dataset=cfg.dataset, task=data.task, run_id=run_id,
                    commit=git_commit(), inputs=inputs, outputs=output_names(data.task),
                    size_multiple=multiple, preprocess=preprocess)
    export(merged(model, cfg), spec.inputs, facts, out, metadata, multiple, padded, data.task)
    try:
        report = check(out, model, spec.inputs, facts, multiple, padded, data.task)
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
    return write_test_images(args.samples, cfg, data, preprocess, out.parent / "samples")


def write_test_images(n: int | None, cfg, data, preprocess, folder: Path) -> int:
    """--samples N: N test images beside the model, each named by its index and label(s); main's exit code."""
    from common.data import options

    if not n:
        return 0
    if preprocess is None:
        print(f"--samples: {cfg.dataset} holds no images; none written", file=sys.stderr)
        return 0
    try:
        test_set = data.read(**options(cfg))[1]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    paths = write_samples(folder, test_set, preprocess, n)
    named = {"detection": "index_labels.png, the labels of its boxes",
             "segmentation": "index_labels.png, the classes of its mask"}.get(data.task, "index_label.png")
    print(f"  {len(paths)} test images in {folder}/ (named {named})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
