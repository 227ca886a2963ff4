"""The training configuration: one typed dataclass, its command-line flags and its checks.

Values are resolved in three layers: TrainConfig's defaults, then the paper
spec's `defaults`, then the flags the user gave. `validate` turns every mistake
into a ConfigError whose message is one line naming the valid choices; train.py
prints it and exits with code 2 before anything is written.
"""

import argparse
import ast
import dataclasses
import inspect
import re
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from common.choices import (AC_MODES, BPE_VOCAB_SIZE, FETCHED, HF_PREFIX, LR_SCALINGS, OPTIMIZERS, PP_SCHEDULES,
                            READS_FOLDER, SCHEDULES, STRATEGIES, TOKENIZERS)
from common.errors import ConfigError
from common.preemption import parse_time_limit

# Nothing above imports torch: --help and a mistyped flag are answered at once (docs/performance.md).
# What checks a value by building something (validate) imports it there.

PRECISIONS = ("fp32", "bf16", "fp16")
NONFINITE = ("stop", "skip")  # what a NaN or infinite loss does
BUCKETING = ("none", "size")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
WANDB_MODES = ("auto", "online", "offline", "disabled")
RECIPES = ("repo", "paper")


@dataclass
class TrainConfig:
    paper: str
    flavor: str = "tiny"  # with init SOURCE:NAME: the reference's SOURCE:NAME
    init: str | None = None  # start from pretrained weights: timm:NAME, torchvision:NAME, ...@FILE, or a run directory
    model_kwargs: dict = field(default_factory=dict)  # the flavor's constructor arguments overridden, e.g. activation
    dataset: str = "digits"  # a registered name, or hf:NAME_OR_PATH[:CONFIG] (common.data.hf)
    data_dir: str | None = None
    hf_split: str | None = None  # hf: data sets: TRAIN[,TEST] (None: train,test, or the only split cut 80/20)
    hf_columns: str | None = None  # hf: data sets: ROLE=COLUMN,... (None: read from the column names)
    train_fraction: float = 1.0  # train on this fixed share of the training split (the same samples every seed)
    download: bool = False  # fetch the data set into data_dir (default data/; hf: the Hugging Face cache) first
    image_size: int | None = None  # resize images to this side (real image data sets)
    pad_multiple: int = 1  # padded batch sizes are rounded up to a multiple of this
    bucketing: str = "none"  # "size": batches of samples of similar size
    epochs: int = 10
    max_steps: int | None = None  # stop after this many optimizer steps (the schedule ends there too)
    batch_size: int | str = 64  # global: samples per optimizer step over all processes and micro-steps; or "auto"
    lr_scaling: str = "linear"  # the lr follows the batch from lr_batch: linear, sqrt or none
    lr_batch: int | None = None  # the batch lr is given for: the paper's default (recipe's) batch; None: any
    recipe: str = "repo"  # "paper": the paper's own recipe (PaperSpec.recipe) over its defaults
    optimizer: str = "adamw"  # adamw, sgd or rmsprop
    lr: float = 1e-3  # peak learning rate, reached after warmup
    momentum: float = 0.9  # sgd's and rmsprop's
    nesterov: bool = False  # sgd with Nesterov momentum
    weight_decay: float = 0.05
    warmup_steps: int = 0
    lr_in_use: float | None = None  # set by the trainer: lr after --lr-scaling (recomputed on resume)
    warmup_in_use: int | None = None  # set by the trainer: warmup_steps, or Goyal et al.'s 5 epochs if longer
    schedule: str = "cosine"  # after warmup: cosine, step (milestones, gamma), exponential (gamma per epoch), constant
    milestones: str | None = None  # step schedule: fractions of the run, e.g. "0.5,0.75"
    gamma: float = 0.1  # the factor at each milestone, or per epoch
    gammas: str | None = None  # step schedule: one factor per milestone instead of gamma, e.g. "0.4,0.5"
    augment: str = "auto"  # training-image augmentation, e.g. "crop:4,flip" (see common.data.augment); auto: the
    # data set's own (DatasetSpec.augment), which the trainer writes into config.json in its place
    label_smoothing: float = 0.0
    block_size: int | None = None  # language modeling: tokens a sample reads (None: the data set's, 128 for pydoc)
    seq_len: int | None = None  # generated sequences: their (minimal) length, for data sets that take one
    tokenizer: str = "char"  # language modeling: "char", or "bpe" (byte-level, trained on the training split)
    vocab_size: int | None = None  # --tokenizer bpe: tokens in its vocabulary (None: 1024)
    beam: int = 1  # seq2seq evaluation: beam search of this width; 1 decodes greedily
    length_penalty: float = 0.0  # beam search ranks by log p / ((5 + |Y|) / 6)^this (Wu et al.); 0: log p alone
    seed: int = 0
    precision: str = "fp32"
    grad_accum: int = 1  # micro-steps per optimizer step
    clip_grad: float = 0.0  # max global gradient norm; 0 turns clipping off
    strategy: str = "auto"
    dp_replicate: int | None = None  # data-parallel copies (common.mesh); None: as --strategy says
    dp_shard: int | None = None  # data-parallel ranks sharding the model (FSDP2); None: as --strategy says
    tp: int = 1  # tensor-parallel ranks (--tp): the paper's tp_plan split over this many processes
    sequence_parallel: bool = False  # with --tp, the positions between the split layers split too
    ac: str = "none"  # activation checkpointing: none, full (every block) or selective (every other block)
    pp: int = 1  # pipeline-parallel ranks (--pp): the paper's blocks cut into this many stages
    pp_schedule: str = "1f1b"  # the pipeline's schedule: gpipe, 1f1b or interleaved
    microbatches: int | None = None  # with --pp: pieces of each rank's batch; None: one per stage's rank (--pp)
    compile: bool = False
    compile_mode: str = "default"  # torch.compile's mode
    compile_backend: str = "inductor"  # torch.compile's backend ("eager" and "aot_eager" check tracing only)
    out: str | None = None  # the run directory; default runs/<paper>-<time>-<id>
    ckpt_every: int | None = None  # optimizer steps between checkpoints; None: at each epoch's end
    keep_ckpts: int = 2  # the newest checkpoints kept
    nonfinite: str = "stop"  # a NaN or infinite loss: stop the run, or skip that step's update
    nonfinite_patience: int = 10  # --nonfinite skip: stop after this many skipped steps in a row
    time_limit: str | None = None  # HH:MM:SS: stop with a checkpoint before this much wall time has passed
    results_dir: str = "results"  # the local results store every finished run is added to
    wandb: str = "auto"
    wandb_project: str = "paper-study"
    log_every: int = 10  # optimizer steps between logged losses
    profile: int = 0  # record this many training steps with torch.profiler (0: off)
    num_workers: int = 0

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """A config from a dict (config.json, or code); unknown keys and wrong types are errors."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"unknown config key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(names))}")
        if "paper" not in values:
            raise ConfigError("no paper given; choose one with --paper")
        hints = typing.get_type_hints(cls)
        for key, value in values.items():
            if not _is_instance(value, hints[key]):
                raise ConfigError(f"{key} must be {_type_name(hints[key])}, got {value!r}")
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _is_instance(value, hint) -> bool:
    if isinstance(hint, types.UnionType):
        return any(_is_instance(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint) -> str:
    if isinstance(hint, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            dict: "a mapping of names to values"}.get(hint, "null")


# ---------------------------------------------------------------- command line


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line on stderr and exit code 2, with no usage block."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


def _number(kind: type, minimum: float, inclusive: bool, also: str = ""):
    word = {(int, False): "a positive integer", (int, True): "an integer >= 0",
            (float, False): "a positive number", (float, True): "a number >= 0"}[kind, inclusive]
    word = f"{word} {also}".strip()

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {word}, got '{text}'") from None
        if value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"expected {word}, got '{text}'")
        return value

    parse.__name__ = word
    return parse


positive_int = _number(int, 0, inclusive=False)
non_negative_int = _number(int, 0, inclusive=True)
positive_float = _number(float, 0, inclusive=False)
non_negative_float = _number(float, 0, inclusive=True)


def batch_size_arg(text: str) -> int | str:
    return "auto" if text == "auto" else _number(int, 0, inclusive=False, also="or auto")(text)


def fraction_arg(text: str) -> float:
    value = _number(float, 0, inclusive=False, also="up to 1")(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a positive number up to 1, got '{text}'")
    return value


def boolean(text: str) -> bool:
    """A switch's value, for `--compile=True` as a W&B sweep writes a boolean parameter."""
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


# One KEY=VALUE, or several in one argument separated by spaces ("cell=rnn hidden_size=64", as one
# W&B sweep value holds them); a value may hold spaces itself: "widths=(16, 32)".
_KWARG = re.compile(r"\s+(?=[A-Za-z_]\w*=)")
_LITERALS = (bool, int, float, str, type(None))


def parse_model_kwargs(items: list[str]) -> dict:
    """{name: value} of --model-kwargs KEY=VALUE ...: each value read as a Python literal (an int, a
    float, True/False, None, a quoted string, or a tuple of them, kept as a list, as JSON keeps it), and
    as a plain string where it is none (activation=tanh). ValueError for a malformed item."""
    kwargs = {}
    for item in (part for text in items for part in _KWARG.split(text.strip()) if part):
        key, eq, text = item.partition("=")
        if not eq or not key.isidentifier():
            raise ValueError(f"--model-kwargs takes KEY=VALUE items, got '{item}'")
        if key in kwargs:
            raise ValueError(f"--model-kwargs gives {key} twice")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        if isinstance(value, (tuple, list)) and all(isinstance(v, _LITERALS) for v in value):
            value = list(value)
        elif not isinstance(value, _LITERALS):
            raise ValueError(f"--model-kwargs {item}: a value is a number, True, False, None, a string, or a "
                             f"tuple of them")
        kwargs[key] = value
    return kwargs


def describe_kwargs(kwargs: dict) -> str:
    """activation=tanh, widths=(16, 32): model arguments as a flavor column and a log line show them."""
    show = lambda v: f"({', '.join(map(repr, v))})" if isinstance(v, list) else v if isinstance(v, str) else repr(v)
    return ", ".join(f"{k}={show(v)}" for k, v in kwargs.items())


class _ModelKwargs(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        try:
            given = parse_model_kwargs(values)
        except ValueError as e:
            raise argparse.ArgumentError(self, str(e)) from None
        earlier = getattr(namespace, self.dest, {})
        twice = sorted(earlier.keys() & given.keys())
        if twice:
            raise argparse.ArgumentError(self, f"--model-kwargs gives {twice[0]} twice")
        setattr(namespace, self.dest, earlier | given)


def _switch(p: argparse.ArgumentParser, flag: str, help: str) -> None:
    """A boolean flag: `--flag` alone, or `--flag=true` / `--flag=false` (what W&B's ${args} writes)."""
    p.add_argument(flag, nargs="?", const=True, type=boolean, metavar="BOOL", help=help)


def build_parser() -> argparse.ArgumentParser:
    """Every flag defaults to 'not given', so the paper's defaults can fill what the user left out.

    The flags come in groups, as torchtitan's config sections: the run, the model, the data, the training
    loop, the optimization, evaluation, parallelism, checkpoints, tracking and profiling."""
    folders, fetched = ", ".join(READS_FOLDER), ", ".join(FETCHED)
    p = _Parser(prog="train.py", description="Train a paper's model with the shared trainer. A flag left out "
                "takes the paper's default, else TrainConfig's (common/config.py).",
                argument_default=argparse.SUPPRESS, allow_abbrev=False)

    g = p.add_argument_group("run", "what to run, and where it goes")
    _switch(g, "--list", help="list the papers and exit")
    g.add_argument("--paper", help="which paper (see --list)")
    g.add_argument("--out", help="the run directory, which must not hold a run yet (default "
                   "runs/<paper>-<time>-<id>)")
    g.add_argument("--rerun", metavar="RUN_ID_OR_DIR", help="run a finished run's config again, in a new run directory")

    g = p.add_argument_group("model")
    g.add_argument("--flavor", help="model flavor; 'tiny' (default) or the paper's own sizes")
    g.add_argument("--init", metavar="REF", help="start from a reference model's pretrained weights: timm:NAME, "
                   "torchvision:NAME, or either as SOURCE:NAME@FILE (it takes the place of --flavor); or from a "
                   "finished run of the same paper, RUN_DIR: the tensors of --flavor's model that its "
                   "model.safetensors holds by name and shape (a pre-trained body; a new head stays new)")
    g.add_argument("--model-kwargs", nargs="+", action=_ModelKwargs, metavar="KEY=VALUE",
                   help="override the flavor's constructor arguments, each value a Python literal or a plain "
                        "string (activation=tanh shortcut=none hidden_size=64)")

    g = p.add_argument_group("data")
    g.add_argument("--dataset", help="dataset name, or hf:NAME_OR_PATH[:CONFIG] for a Hugging Face data set (a "
                   "save_to_disk folder, parquet or arrow files, or a Hub data set in the local cache); the paper's "
                   "default if left out")
    g.add_argument("--data-dir", help=f"the folder (or file) that a data set read from disk is read from: "
                   f"{folders}; for wds a pattern of shards ('DIR/train-{{000000..000009}}.tar'); for hf: data "
                   f"sets, the Hugging Face cache (default: datasets' own)")
    _switch(g, "--download", help=f"fetch {fetched} into --data-dir (default data/), or an hf: Hub data set into "
            f"the Hugging Face cache, first")
    g.add_argument("--hf-split", metavar="TRAIN[,TEST]", help="hf: data sets: the splits to train and test on "
                   "(default train,test, or the only split cut 80/20); one name: that split cut 80/20 into train and "
                   "test")
    g.add_argument("--hf-columns", metavar="ROLE=COLUMN,...", help="hf: data sets: the columns to read, which set the "
                   "task: image=COL,label=COL (classification), text=COL (language modeling) or source=COL,target=COL "
                   "(seq2seq); default: from the column names (image or img and label; text; source and target)")
    g.add_argument("--train-fraction", type=fraction_arg, metavar="F",
                   help="train on a fixed share F of the training split (the same samples for every seed; "
                        "a smaller share is part of a larger one); the test split is whole")
    g.add_argument("--image-size", type=positive_int, help="resize images to N x N (image data sets but the "
                   "detection ones)")
    g.add_argument("--augment", help="training-image augmentation: scale:LO-HI, rrc:MIN, crop:P, flip, lighting:S, "
                   "or none; auto (default): the data set's own, crop:4,flip for fashion-mnist, crop:4 for mnist, "
                   "none for the others")
    g.add_argument("--pad-multiple", type=positive_int, help="round padded sizes up to a multiple of N")
    g.add_argument("--bucketing", choices=BUCKETING, help="size: batch samples of similar size together")
    g.add_argument("--block-size", type=positive_int, help="text data sets: tokens a sample reads (default: the "
                   "data set's, 128)")
    g.add_argument("--seq-len", type=positive_int, metavar="T",
                   help="generated sequences (adding-1997): the minimal length T (default 100)")
    g.add_argument("--tokenizer", choices=TOKENIZERS, help="text data sets but tokens (whose meta.json holds its "
                   "own): char (default), or bpe: a byte-level BPE trained on the training split, saved in the run "
                   "directory as tokenizer.json")
    g.add_argument("--vocab-size", type=positive_int, help=f"--tokenizer bpe: its vocabulary, 256 bytes and the "
                   f"merges (default {BPE_VOCAB_SIZE})")
    g.add_argument("--num-workers", type=non_negative_int, help="DataLoader worker processes")

    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=positive_int, help="passes over the training split")
    g.add_argument("--max-steps", type=positive_int, help="stop after this many optimizer steps")
    g.add_argument("--batch-size", type=batch_size_arg,
                   help="global batch, whatever the number of processes; auto: the largest that fits")
    g.add_argument("--grad-accum", type=positive_int, help="micro-steps per optimizer step")
    g.add_argument("--precision", choices=PRECISIONS, help="fp32 (default); bf16 or fp16: autocast (fp16 with a "
                   "gradient scaler, CUDA only)")
    g.add_argument("--label-smoothing", type=non_negative_float, help="tasks with classes: the smoothing of the "
                   "training loss (default 0)")
    g.add_argument("--seed", type=non_negative_int)
    g.add_argument("--nonfinite", choices=NONFINITE, help="a NaN or infinite loss: stop (default; exit code 65) or "
                   "skip that step's update on every rank")
    g.add_argument("--nonfinite-patience", type=positive_int, help="with --nonfinite skip: stop after this many "
                   "skipped steps in a row (default 10)")

    g = p.add_argument_group("optimization")
    g.add_argument("--recipe", choices=RECIPES, help="repo (default): the paper's defaults here (mostly AdamW, warmup, "
                   "cosine); paper: the paper's own (PaperSpec.recipe)")
    g.add_argument("--optimizer", choices=OPTIMIZERS)
    g.add_argument("--lr", type=positive_float, help="peak learning rate")
    g.add_argument("--lr-scaling", choices=LR_SCALINGS,
                   help="the learning rate follows the batch size from the paper's (or its recipe's) batch: linear "
                        "(default; Goyal et al., with a warmup of at least 5 epochs when it grows), sqrt, or none")
    g.add_argument("--momentum", type=non_negative_float, help="sgd's and rmsprop's momentum")
    _switch(g, "--nesterov", help="sgd with Nesterov momentum")
    g.add_argument("--weight-decay", type=non_negative_float)
    g.add_argument("--clip-grad", type=non_negative_float, help="max gradient norm; 0 turns it off")
    g.add_argument("--warmup-steps", type=non_negative_int)
    g.add_argument("--schedule", choices=SCHEDULES, help="after warmup: cosine, step, exponential, constant; noam: "
                   "the Transformer's warmup then 1/sqrt(step) decay")
    g.add_argument("--milestones", help="step schedule: fractions of the run where lr is multiplied by gamma")
    g.add_argument("--gamma", type=positive_float, help="step: the factor at each milestone; exponential: per epoch")
    g.add_argument("--gammas", help="step: one factor per milestone, e.g. 0.4,0.5 (instead of one gamma)")

    g = p.add_argument_group("evaluation")
    g.add_argument("--beam", type=positive_int, help="seq2seq: evaluate by beam search of this width (default 1: "
                   "greedy)")
    g.add_argument("--length-penalty", type=non_negative_float,
                   help="beam search: rank by log p / ((5 + length) / 6)^ALPHA (the Transformer's 0.6; default 0)")

    g = p.add_argument_group("parallelism", "applied in common/parallel.py in one order: tensor parallel, "
                             "activation checkpointing, compile, then the data-parallel wrapping")
    g.add_argument("--strategy", choices=STRATEGIES, help="auto: ddp under torchrun with >1 process, else single")
    g.add_argument("--dp-replicate", type=positive_int, help="data parallel: copies of the model that average "
                   "their gradients (with --dp-shard: HSDP); the mesh's sizes multiply to the processes")
    g.add_argument("--dp-shard", type=positive_int, help="data parallel: ranks that shard the model, its gradients "
                   "and optimizer state (FSDP2)")
    g.add_argument("--tp", type=positive_int, help="tensor parallel: split the linear layers of the paper's tp_plan "
                   "over this many neighbouring processes (vit, gpt, transformer)")
    _switch(g, "--sequence-parallel", help="with --tp: split the positions between the split layers (the norms, "
            "residual adds and dropouts) over the ranks too (pre-norm blocks: vit, gpt's GPT-2 flavors)")
    g.add_argument("--pp", type=positive_int, help="pipeline parallel: cut the paper's blocks into stages on this "
                   "many processes, the embedding with the first, the head and loss with the last (gpt, resnet, vgg, "
                   "vit)")
    g.add_argument("--pp-schedule", choices=PP_SCHEDULES, help="with --pp: gpipe, 1f1b (default) or interleaved "
                   "(two stages per process)")
    g.add_argument("--microbatches", type=positive_int, help="with --pp: pieces of each process's batch that flow "
                   "through the stages (default: --pp)")
    g.add_argument("--ac", choices=AC_MODES, help="activation checkpointing: each of the paper's blocks (full) or "
                   "every other block (selective) recomputes its activations in backward (default none)")
    _switch(g, "--compile", help="torch.compile the model")
    g.add_argument("--compile-mode", choices=COMPILE_MODES, help="torch.compile mode (with --compile)")
    g.add_argument("--compile-backend", choices=COMPILE_BACKENDS, help="torch.compile backend (with --compile; eager "
                   "and aot_eager check tracing only)")

    g = p.add_argument_group("checkpoints")
    g.add_argument("--resume", metavar="RUN_DIR", help="continue this run from its latest complete checkpoint")
    g.add_argument("--ckpt-every", type=positive_int, help="steps between checkpoints (default: each epoch's end)")
    g.add_argument("--keep-ckpts", type=positive_int, help="newest checkpoints to keep (default 2)")
    g.add_argument("--time-limit", metavar="HH:MM:SS", help="stop with a checkpoint (exit code 75) before this much "
                   "wall time has passed since the start, as SIGTERM and SIGUSR1 do (a job's limit)")

    g = p.add_argument_group("tracking and profiling")
    g.add_argument("--results-dir", help="the results store finished runs are added to (default results/)")
    g.add_argument("--wandb", choices=WANDB_MODES, help="auto: online with an API key, else offline")
    g.add_argument("--wandb-project")
    g.add_argument("--log-every", type=positive_int, help="optimizer steps between logged losses")
    g.add_argument("--profile", type=non_negative_int, metavar="N",
                   help="record N training steps with torch.profiler (after 2 warm-up steps) into the run "
                        "directory's profile/")
    return p


# flags that may change when a run is resumed: how it runs, not what it computes
RESUMABLE = {"strategy", "dp_replicate", "dp_shard", "tp", "sequence_parallel", "pp", "pp_schedule", "microbatches",
             "ac", "time_limit", "nonfinite", "nonfinite_patience", "wandb", "results_dir", "log_every",
             "num_workers", "ckpt_every", "keep_ckpts", "compile", "compile_mode", "compile_backend", "download",
             "profile"}


def resolve_resume(flags: dict) -> TrainConfig:
    """The config of the run in `flags["resume"]`, with the few flags that may change on resume.

    The run's other flags may be given again (the command that started it, with --resume added), as
    long as their values are the saved ones; `--batch-size auto` stands for the batch it picked.
    """
    run_dir = Path(flags.pop("resume"))
    if not (run_dir / "config.json").is_file():
        raise ConfigError(f"--resume {run_dir}: no run there (no config.json)")
    try:
        saved = json.loads((run_dir / "config.json").read_text()) | {"out": str(run_dir)}
    except ValueError as e:
        raise ConfigError(f"--resume {run_dir}: config.json is not valid JSON ({e})") from None
    for key in sorted(set(flags) - RESUMABLE):
        given, was = flags.pop(key), saved.get(key, getattr(TrainConfig, key, None))
        if not (given == was or (key == "out" and Path(given).resolve() == run_dir.resolve())
                or (key == "batch_size" and given == "auto")):
            can = ", ".join("--" + f.replace("_", "-") for f in sorted(RESUMABLE))
            raise ConfigError(f"--{key.replace('_', '-')} cannot change when resuming: the run has {was!r}, "
                              f"you gave {given!r}; only {can} can change")
    if (run_dir / "result.json").exists():
        raise ConfigError(f"--resume {run_dir}: that run has finished (result.json); start a new one")
    return TrainConfig.from_dict(saved | flags)


# flags that may change in a rerun: where it goes, not what it computes
RERUNNABLE = {"out", "wandb", "wandb_project", "results_dir"}


def resolve_rerun(flags: dict) -> tuple[TrainConfig, str | None]:
    """The config of a finished run (by run id or run directory) for a new run, and a warning
    when this checkout's commit differs from the one the run was made at."""
    from common.tracking import find_result, git_commit

    run = flags.pop("rerun")
    fixed = sorted(set(flags) - RERUNNABLE)
    if fixed:
        raise ConfigError(f"--{fixed[0].replace('_', '-')} cannot change in a rerun; only "
                          f"{', '.join('--' + f.replace('_', '-') for f in sorted(RERUNNABLE))} can")
    result, _ = find_result(run, flags.get("results_dir", TrainConfig.results_dir))
    cfg = TrainConfig.from_dict(result["config"] | {"out": None} | flags)
    now, then = git_commit(), result.get("commit")
    warning = None if now == then else f"this checkout is at commit {now}, the run {run} was made at {then}"
    return cfg, warning


def resolve(flags: dict) -> TrainConfig:
    """TrainConfig defaults, then the paper's defaults, then the flags given (--init RUN_DIR keeps the
    flavor; --init SOURCE:NAME stands in its place)."""
    from common.pretrained import architecture_name, is_run
    from papers import get_paper

    if "paper" not in flags:
        from papers import list_papers

        raise ConfigError(f"--paper is required; choose from: {', '.join(list_papers())}")
    try:
        spec = get_paper(flags["paper"])
    except ValueError as e:
        raise ConfigError(str(e)) from None
    spec = spec.for_flavor(flags.get("flavor", "tiny"))
    recipe = {}
    if flags.get("recipe") == "paper":
        if not spec.recipe:
            raise ConfigError(f"--recipe paper: {spec.name} has no recipe of its paper yet (PaperSpec.recipe)")
        recipe = spec.recipe
    if flags.get("download") and "data_dir" not in flags and not flags.get("dataset", "").startswith(HF_PREFIX):
        flags = flags | {"data_dir": "data"}  # (a Hub data set goes into the Hugging Face cache)
    if "init" in flags and not is_run(flags["init"]):  # the reference's architecture takes the place of the flavor
        if "flavor" in flags:
            raise ConfigError(f"--init {flags['init']} names the model; leave out --flavor {flags['flavor']}")
        flags = flags | {"flavor": architecture_name(flags["init"])}
    values = {**spec.defaults, **recipe}
    lr_batch = {"lr_batch": values.get("batch_size", TrainConfig.batch_size)}  # the batch --lr is meant for
    return TrainConfig.from_dict({**lr_batch, **values, **flags})


# ---------------------------------------------------------------- checks


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def validate(cfg: TrainConfig, world_size: int = 1, device_type: str | None = None, resuming: bool = False) -> None:
    """Raise ConfigError for the first thing wrong with `cfg`; writes nothing but, with --download,
    the data set's files.

    Args:
        resuming: the run continues in cfg.out (--resume, or a torchrun restart), which
            may therefore already hold it.
    """
    import torch

    from common.data import DATASETS, download, get_dataset, options
    from common.data.augment import parse as parse_augment
    from common.mesh import resolve as resolve_layout
    from common.optim import parse_gammas, parse_milestones
    from common.parallel import resolve_strategy
    from common.pretrained import build_model, check_run, is_run
    from papers import get_paper

    try:
        spec = get_paper(cfg.paper)
        data = get_dataset(cfg.dataset, cfg.hf_columns, cfg.data_dir, online=cfg.download)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if (cfg.hf_split is not None or cfg.hf_columns is not None) and "hf_split" not in data.options:
        raise ConfigError(f"--hf-split and --hf-columns choose the splits and columns of a Hugging Face data set "
                          f"(--dataset hf:NAME_OR_PATH); {data.name} is not one")
    if (cfg.init is None or is_run(cfg.init)) and cfg.flavor not in spec.flavors:
        raise ConfigError(f"unknown flavor '{cfg.flavor}' for {spec.name}; choose from: {', '.join(spec.flavors)}")
    check_model_kwargs(spec, cfg)
    spec = spec.for_flavor(cfg.flavor)
    if data.inputs != spec.inputs:
        raise ConfigError(f"{spec.name} reads {spec.inputs} inputs but dataset {data.name} has {data.inputs} inputs")
    for choices, name in ((PRECISIONS, "precision"), (WANDB_MODES, "wandb"), (BUCKETING, "bucketing"),
                          (COMPILE_MODES, "compile_mode"), (COMPILE_BACKENDS, "compile_backend"),
                          (RECIPES, "recipe"), (OPTIMIZERS, "optimizer"), (SCHEDULES, "schedule"),
                          (TOKENIZERS, "tokenizer"), (LR_SCALINGS, "lr_scaling"), (AC_MODES, "ac"),
                          (PP_SCHEDULES, "pp_schedule"), (NONFINITE, "nonfinite")):
        if getattr(cfg, name) not in choices:
            raise ConfigError(f"unknown {name} '{getattr(cfg, name)}'; choose from: {', '.join(choices)}")
    if cfg.ac != "none" and not spec.shard_blocks:
        raise ConfigError(f"--ac {cfg.ac} recomputes the activations of a paper's repeated blocks; {spec.name} "
                          f"{cfg.flavor} names none (shard_blocks)")
    for name in ("epochs", "grad_accum", "log_every", "max_steps", "ckpt_every", "keep_ckpts",
                 "image_size", "pad_multiple"):
        value = getattr(cfg, name)
        if value is not None and value <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {value}")
    if cfg.lr <= 0:
        raise ConfigError(f"lr must be a positive number, got {cfg.lr}")
    for name in ("weight_decay", "warmup_steps", "label_smoothing", "clip_grad", "seed", "num_workers", "profile"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if not 0 < cfg.train_fraction <= 1:
        raise ConfigError(f"train_fraction must be above 0 and at most 1, got {cfg.train_fraction}")
    if cfg.train_fraction < 1 and data.streamed:
        raise ConfigError(f"--train-fraction takes a fixed share of samples by index; {data.name} streams its "
                          f"training set: write shards of the share instead")
    if cfg.seq_len is not None and "seq_len" not in data.options:
        takes = ", ".join(name for name, d in DATASETS.items() if "seq_len" in d.options)
        raise ConfigError(f"--seq-len sets the length of generated sequences ({takes}); {data.name} has its own")
    if cfg.label_smoothing >= 1:
        raise ConfigError(f"label_smoothing must be below 1, got {cfg.label_smoothing}")
    if (cfg.beam != 1 or cfg.length_penalty) and data.task != "seq2seq":
        raise ConfigError(f"--beam and --length-penalty decode sequences; {data.name} is a {data.task} data set")
    if cfg.block_size is not None and data.inputs != "tokens":
        raise ConfigError(f"--block-size cuts text into samples; {data.name} has {data.inputs} inputs")
    if (cfg.tokenizer != "char" or cfg.vocab_size is not None) and data.inputs == "tokens" \
            and "tokenizer" not in data.options:
        raise ConfigError(f"--tokenizer and --vocab-size do not apply to {data.name}: its tokenizer comes with its "
                          f"data (--data-dir's meta.json)")
    if cfg.tokenizer != "char" and data.inputs != "tokens":
        raise ConfigError(f"--tokenizer {cfg.tokenizer} splits text into tokens; {data.name} has {data.inputs} inputs")
    if cfg.vocab_size is not None and cfg.tokenizer != "bpe":
        raise ConfigError("--vocab-size sizes a BPE vocabulary; add --tokenizer bpe")
    if cfg.vocab_size is not None and cfg.vocab_size <= 256:
        raise ConfigError(f"--vocab-size {cfg.vocab_size}: a byte-level BPE holds the 256 bytes and its merges; "
                          f"use more than 256")
    positions = spec.flavors.get(cfg.flavor, {}).get("block_size")  # a language model's learned positions
    if cfg.block_size is not None and positions is not None and cfg.block_size > positions:
        raise ConfigError(f"--block-size {cfg.block_size} exceeds the {positions} positions of {spec.name} {cfg.flavor}")
    if cfg.beam < 1 or cfg.length_penalty < 0:
        raise ConfigError(f"beam must be >= 1 and length_penalty >= 0, got {cfg.beam} and {cfg.length_penalty}")
    if cfg.momentum < 0 or cfg.gamma <= 0:
        raise ConfigError(f"momentum must be >= 0 and gamma > 0, got {cfg.momentum} and {cfg.gamma}")
    try:
        if cfg.schedule == "step":
            parse_gammas(cfg.gammas, len(parse_milestones(cfg.milestones)))
        elif cfg.gammas is not None:
            raise ValueError(f"--gammas goes with the step schedule, not {cfg.schedule}")
        augment_steps = parse_augment(data.training_augment(cfg.augment))
        if cfg.time_limit is not None:
            parse_time_limit(cfg.time_limit)
    except ValueError as e:
        raise ConfigError(str(e)) from None

    if isinstance(cfg.batch_size, str) and cfg.batch_size != "auto":
        raise ConfigError(f"batch_size must be a positive integer or auto, got '{cfg.batch_size}'")
    if isinstance(cfg.batch_size, int) and cfg.batch_size <= 0:
        raise ConfigError(f"batch_size must be a positive integer or auto, got {cfg.batch_size}")
    readers = max(1, world_size // (cfg.tp * cfg.pp))  # the processes that read different data
    if cfg.microbatches is not None and cfg.pp == 1 and not resuming:  # a pipeline's run may resume in one process
        raise ConfigError("--microbatches cuts each batch for a pipeline's stages; add --pp N")
    microbatches = (cfg.microbatches or cfg.pp) if cfg.pp > 1 else 1
    shards = readers * cfg.grad_accum * microbatches
    if cfg.batch_size != "auto" and cfg.batch_size % shards:
        below, above = cfg.batch_size // shards * shards, (cfg.batch_size // shards + 1) * shards
        nearest = f"{below} or {above}" if below else f"{above}"
        pieces = f" x {microbatches} microbatches" if cfg.pp > 1 else ""
        raise ConfigError(
            f"batch size {cfg.batch_size} does not divide over {readers} process(es) x {cfg.grad_accum} "
            f"accumulation step(s){pieces}; use a multiple of {shards}, such as {nearest}"
        )
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.precision == "fp16" and device_type != "cuda":
        raise ConfigError("fp16 needs a CUDA device; on a CPU use --precision bf16")

    if cfg.image_size is not None and not data.resizable:
        resizable = ", ".join(name for name, d in DATASETS.items() if d.resizable)
        raise ConfigError(f"--image-size does not apply to {data.name}; it resizes {resizable}")
    if cfg.download:  # the one thing validation writes, when asked: the data set's files
        line = download(data, cfg.data_dir)
        if os.environ.get("RANK", "0") == "0":
            print(line, flush=True)
    facts = data.facts(**options(cfg))  # ConfigError when the data is missing
    variable = data.is_variable(cfg.image_size)
    if variable and not spec.padded_batches:
        raise ConfigError(_fixed_size_fix(spec, data))
    if augment_steps and (data.inputs != "image" or variable):
        raise ConfigError(f"--augment {data.training_augment(cfg.augment)} transforms images of one size; "
                          f"{data.name} has {'images of many sizes' if variable else data.inputs + 's'}")
    if cfg.bucketing == "size" and not variable:
        variable_sets = ", ".join(name for name, d in DATASETS.items() if d.variable_size)
        resized = " once --image-size resizes it" if data.variable_size else ""
        raise ConfigError(f"--bucketing size needs samples of different sizes; {data.name} has one size{resized} "
                          f"(variable-size data sets: {variable_sets})")
    try:
        with torch.device("meta"):  # builds nothing real: catches a flavor that cannot take the dataset
            model = build_model(spec, cfg.flavor, cfg.init, facts, cfg.model_kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        if cfg.model_kwargs:
            raise ConfigError(f"{spec.name} {cfg.flavor} with --model-kwargs {describe_kwargs(cfg.model_kwargs)}: "
                              f"{' '.join(str(e).split())}") from None
        raise ConfigError(f"flavor {cfg.flavor} of {spec.name} cannot train on {data.name}: {e}") from None
    if cfg.init is not None and is_run(cfg.init):
        check_run(spec, cfg.init, model, facts, _run_facts(cfg.init))
    multiple = getattr(model, "input_multiple", 1)
    if variable and facts.get("size_multiple", 1) % multiple:
        raise ConfigError(f"flavor {cfg.flavor} of {spec.name} needs image sides that are multiples of {multiple}, "
                          f"but {data.name}'s sides are multiples of {facts.get('size_multiple', 1)}")

    try:
        resolve_strategy(cfg.strategy, world_size)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.tp > 1:
        _check_tensor_parallel(spec, cfg.tp, model)
    if cfg.sequence_parallel:
        _check_sequence_parallel(spec, cfg, model)
    if cfg.pp > 1:
        _check_pipeline(spec, cfg, data, variable, model)
    if world_size > 1 or cfg.tp > 1 or cfg.pp > 1 or (cfg.dp_replicate or 1) > 1 or (cfg.dp_shard or 1) > 1:
        try:
            resolve_layout(resolve_strategy(cfg.strategy, world_size), world_size, cfg.dp_replicate, cfg.dp_shard,
                           cfg.tp, cfg.pp)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    if cfg.out is not None:
        out = Path(cfg.out)
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {cfg.out} is a file, not a folder; choose a new folder")
        if (out / "config.json").exists() and not resuming:
            raise ConfigError(f"--out {cfg.out} already holds a run; choose a new folder")


def _check_tensor_parallel(spec, tp: int, model) -> None:
    """--tp N: a paper with a plan, and every layer it splits divisible by N."""
    from common.tensor_parallel import split_sizes
    from papers import get_paper, list_papers

    if not spec.tp_plan:
        having = ", ".join(name for name in sorted(list_papers()) if get_paper(name).tp_plan)
        raise ConfigError(f"--tp splits the layers a paper's tp_plan names; {spec.name} has none (papers with one: "
                          f"{having})")
    for path, size in split_sizes(model, spec.shard_blocks, spec.tp_plan).items():
        if size % tp:
            raise ConfigError(f"--tp {tp}: {path} splits {size} units (heads x width, or hidden units), "
                              f"which do not divide by {tp}")


def _check_sequence_parallel(spec, cfg: TrainConfig, model) -> None:
    """--sequence-parallel: with --tp, and blocks whose norms sit at their sub-layers' inputs."""
    if cfg.tp < 2:
        raise ConfigError("--sequence-parallel splits the positions between tensor-parallel ranks; add --tp N")
    if "norm" not in spec.tp_plan.values():
        raise ConfigError(f"--sequence-parallel splits the positions at a block's pre-norms; {spec.name}'s plan "
                          f"names none (its blocks normalise after their sub-layers)")
    if not all(getattr(block, "pre_norm", True) for block in model.get_submodule(spec.shard_blocks)):
        raise ConfigError(f"--sequence-parallel splits the positions at a block's pre-norms; {spec.name} "
                          f"{cfg.flavor}'s blocks normalise after their sub-layers (post-norm)")


def _check_pipeline(spec, cfg: TrainConfig, data, variable: bool, model) -> None:
    """--pp N: a paper whose forward is a chain of its blocks, at least a block per stage, inputs of one
    size (stages exchange activations of one shape), a task whose loss reads the outputs alone."""
    from common.pipeline import STAGES_PER_RANK
    from common.tasks import TASKS, Task
    from papers import get_paper, list_papers

    if spec.pipeline is None:
        having = ", ".join(name for name in sorted(list_papers()) if get_paper(name).pipeline)
        raise ConfigError(f"--pp cuts a paper whose forward is a chain of its blocks into stages; {spec.name}'s is not "
                          f"one (papers whose forward is: {having})")
    stages = cfg.pp * STAGES_PER_RANK[cfg.pp_schedule]
    blocks = len(model.get_submodule(spec.shard_blocks))
    if blocks < stages:
        raise ConfigError(f"--pp {cfg.pp} --pp-schedule {cfg.pp_schedule} cuts {stages} stages, but {spec.name} "
                          f"{cfg.flavor} has {blocks} blocks ({spec.shard_blocks}); use fewer stages or a deeper "
                          f"flavor")
    if variable:
        raise ConfigError(f"--pp sends activations of one shape between stages, but the {data.inputs}s of {data.name} "
                          f"differ in size; use a fixed-size data set or --image-size N")
    if TASKS[data.task].forward is not Task.forward:
        raise ConfigError(f"--pp runs models that read their inputs alone; {data.task} models also read the targets")
    if cfg.precision == "fp16":
        raise ConfigError("--pp with fp16: the scaler's skipped steps are not agreed between stages; use bf16")


def _run_facts(run_dir: str) -> tuple[dict, str] | None:
    """A finished run's data set's facts and what it read ("pydoc, --tokenizer char"), from its config;
    None where that data set no longer reads."""
    from common.data import get_dataset, options

    try:
        cfg = TrainConfig.from_dict(json.loads((Path(run_dir) / "config.json").read_text()))
        return (get_dataset(cfg.dataset, cfg.hf_columns, cfg.data_dir).facts(**options(cfg)),
                f"{cfg.dataset}, --tokenizer {cfg.tokenizer}")
    except (ConfigError, ValueError, OSError):
        return None


def check_model_kwargs(spec, cfg: TrainConfig) -> None:
    """--model-kwargs names arguments of the flavor's model class, not ones the data set sets."""
    if not cfg.model_kwargs:
        return
    from common.pretrained import is_run

    if cfg.init is not None and not is_run(cfg.init):
        raise ConfigError(f"--model-kwargs changes a flavor's arguments, but --init {cfg.init} builds the "
                          f"reference's architecture; leave out one of them")
    takes, model = spec.model_arguments(cfg.flavor), spec.for_flavor(cfg.flavor).model.__name__
    for key in cfg.model_kwargs:
        if key in spec.for_flavor(cfg.flavor).data_kwargs:
            raise ConfigError(f"--model-kwargs {key}: {model} takes {key} from the data set, not from the command line")
        if takes is not None and key not in takes:
            raise ConfigError(f"--model-kwargs {key}: {model} ({spec.name} {cfg.flavor}) has no argument '{key}'; "
                              f"its arguments: {', '.join(takes)}")


def _fixed_size_fix(spec, data) -> str:
    """Why a paper that reads one size cannot train on a data set of many, and what to do instead."""
    from common.data import DATASETS

    fixed = ", ".join(name for name, d in DATASETS.items() if d.inputs == data.inputs and not d.variable_size)
    resize = "add --image-size N to resize them all to N x N, or " if data.resizable else ""
    return (f"{spec.name} reads batches of one size (its PaperSpec does not set padded_batches), but the "
            f"{data.inputs}s of {data.name} differ in size: {resize}use a fixed-size data set ({fixed})")


def save(cfg: TrainConfig, path: Path) -> None:
    path.write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
