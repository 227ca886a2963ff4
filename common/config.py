"""The training configuration: its sections (common.sections), the command line generated from them,
the three layers of defaults, and the checks.

Values are resolved in three layers: TrainConfig's defaults, then the paper
spec's `defaults`, then the flags the user gave. `validate` turns every mistake
into a ConfigError whose message is one line naming the valid choices; train.py
prints it and exits with code 2 before anything is written. It asks each concern
in turn: the fields' own ranges and choices, the data (common.data.checks), the
optimizer (common.optim), the model (and LoRA's, common.lora), the mesh (common.mesh), tensor parallelism
(common.tensor_parallel), the pipeline (common.pipeline), the run directory.
"""

import argparse
import dataclasses
import inspect
import json
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from common.choices import HF_PREFIX
from common.errors import ConfigError
from common.preemption import parse_time_limit
from common.flags import Parser, boolean, describe_kwargs, parse_model_kwargs  # noqa: F401 (imported from here)
from common.sections import (SECTIONS, Checkpoints, Data, Evaluation, LoRA, Model, Optimization, Parallelism,
                             Run, Tracking, Training)

# Nothing above imports torch: --help and a mistyped flag are answered at once (docs/performance.md).
# What checks a value by building something (validate) imports it there.

# keys of older runs' config.json that are no longer config: run-time values, now in the training state
# (common.train_state: lr, warmup_steps) and result.json; dropped when such a config is read
LEGACY = {"lr_in_use", "warmup_in_use"}


@dataclass
class TrainConfig(Tracking, Checkpoints, Parallelism, Evaluation, Optimization, Training, Data, LoRA, Model, Run):
    """Every section's fields in one flat config (`cfg.lr`, `cfg.tp`): the fields come in the sections'
    order, run first."""

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """A config from a dict (config.json, or code); unknown keys and wrong types are errors. LEGACY keys,
        which older runs' config.json holds, are dropped."""
        values = {k: v for k, v in values.items() if k not in LEGACY}
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


def _add_flag(group, f: dataclasses.Field) -> None:
    meta, flag = f.metadata, "--" + f.name.replace("_", "-")
    if f.type in (bool, "bool"):  # `--flag` alone, or `--flag=true` / `--flag=false` (what W&B's ${args} writes)
        group.add_argument(flag, nargs="?", const=True, type=boolean, metavar="BOOL", help=meta["help"])
        return
    given = {"type": meta["parse"], "choices": meta["choices"], "metavar": meta["metavar"],
             "action": meta["action"], "nargs": meta["nargs"]}
    group.add_argument(flag, help=meta["help"], **{k: v for k, v in given.items() if v is not None})


def build_parser() -> argparse.ArgumentParser:
    """train.py's flags, one per field of the sections (common.sections), in groups as the sections, and
    the three that say what to do (--list, --rerun, --resume). Every flag defaults to 'not given', so the
    paper's defaults can fill what the user left out."""
    p = Parser(prog="train.py", description="Train a paper's model with the shared trainer. A flag left out "
               "takes the paper's default, else TrainConfig's (common/config.py).",
               argument_default=argparse.SUPPRESS, allow_abbrev=False)
    for title, section in SECTIONS.items():
        written = not section.__doc__.startswith(f"{section.__name__}(")  # (not the dataclass's own)
        g = p.add_argument_group(title, " ".join(section.__doc__.split()) if written else None)
        if title == "run":
            g.add_argument("--list", nargs="?", const=True, type=boolean, metavar="BOOL",
                           help="list the papers and exit")
        if title == "checkpoints":
            g.add_argument("--resume", metavar="RUN_DIR", help="continue this run from its latest complete checkpoint")
        for f in dataclasses.fields(section):
            if f.metadata.get("flag", True):
                _add_flag(g, f)
        if title == "run":
            g.add_argument("--rerun", metavar="RUN_ID_OR_DIR",
                           help="run a finished run's config again, in a new run directory")
    return p


def _marked(mark: str) -> set[str]:
    return {f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get(mark)}


RESUMABLE = _marked("resumable")  # flags that may change when a run is resumed: how it runs, not what it computes


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


RERUNNABLE = _marked("rerunnable")  # flags that may change in a rerun: where it goes, not what it computes


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
    merged = {**lr_batch, **values, **flags}
    if "{seed}" in (merged.get("init") or ""):  # each seed of a sweep from the run of its own seed
        merged["init"] = merged["init"].replace("{seed}", str(merged.get("seed", TrainConfig.seed)))
    cfg = TrainConfig.from_dict(merged)
    if cfg.init is not None and is_run(cfg.init):
        cfg.model_kwargs = kept_from_run(cfg)
    return cfg


def kept_from_run(cfg: TrainConfig) -> dict:
    """--model-kwargs with what --init RUN_DIR's model took from its data set (its flavor's data_kwargs) and
    this flavor's takes as an argument instead, where the run's value is not this flavor's own: BERT's
    `causal` of a pydoc-ltr run, "the left-only constraint was also applied at fine-tuning" (Devlin et al.
    2019, Section 5.1). A --model-kwargs value other than the run's is a ConfigError; a folder that is no
    readable run of this paper is left to check_run."""
    from papers import get_paper

    given = dict(cfg.model_kwargs or {})
    try:
        run = json.loads((Path(cfg.init) / "config.json").read_text())
        theirs, ours = get_paper(run["paper"]).for_flavor(run["flavor"]), get_paper(cfg.paper)
    except (OSError, ValueError, KeyError, TypeError):
        return given
    if theirs.name != ours.name or cfg.flavor not in ours.flavors:
        return given
    keys = [k for k in theirs.data_kwargs if k in (ours.model_arguments(cfg.flavor) or [])]
    facts = (_run_facts(cfg.init) or ({},))[0] if keys else {}  # (read only where something may be kept)
    defaults = {p.name: p.default for p in inspect.signature(ours.for_flavor(cfg.flavor).model).parameters.values()}
    for key in [k for k in keys if k in facts]:
        if key in given and given[key] != facts[key]:
            raise ConfigError(f"--model-kwargs {key}={given[key]}: the model of --init {cfg.init} was built with "
                              f"{key}={facts[key]} (its data set, {run.get('dataset')}); fine-tuning keeps it")
        if facts[key] != ours.flavors[cfg.flavor].get(key, defaults.get(key)):
            given[key] = facts[key]
    return given


# ---------------------------------------------------------------- checks


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def validate(cfg: TrainConfig, world_size: int = 1, device_type: str | None = None, resuming: bool = False) -> None:
    """Raise ConfigError for the first thing wrong with `cfg`, asking each concern in turn; writes nothing.

    Args:
        resuming: the run continues in cfg.out (--resume, or a torchrun restart), which
            may therefore already hold it.
    """
    from common import mesh, optim
    from common.data import checks as data_checks
    from common.pretrained import check_teacher

    check_fields(cfg)
    spec, data = paper_and_data(cfg)
    facts, variable = data_checks.check(cfg, data, spec)
    optim.check(cfg)
    check_training(cfg, device_type)
    model = check_model(spec, cfg, data, facts, variable)
    check_teacher(cfg, spec, data, facts, _run_facts(cfg.teacher) if cfg.teacher else None)  # common.pretrained
    if cfg.tp > 1 or cfg.sequence_parallel:
        from common import tensor_parallel

        tensor_parallel.check(spec, cfg, model)
    if cfg.pp > 1:
        from common import pipeline  # (imported with --pp only: torch.distributed.pipelining is slow to import)

        pipeline.check(spec, cfg, data, variable, model)
    mesh.check(cfg, world_size, strategy_for(cfg, world_size), resuming)  # after what the paper refuses
    check_out(cfg, resuming)


def strategy_for(cfg: TrainConfig, world_size: int) -> str:
    """The strategy that will run (common.parallel.resolve_strategy); a ConfigError where none can."""
    from common.parallel import resolve_strategy

    try:
        return resolve_strategy(cfg.strategy, world_size)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_fields(cfg: TrainConfig) -> None:
    """Each field's own choices and range, as its flag reads them (common.sections): for a config that
    comes from a dict (config.json, a sweep, code) rather than from the command line."""
    for f in dataclasses.fields(cfg):
        value, meta = getattr(cfg, f.name), f.metadata
        if value is None:
            continue
        if meta.get("choices") is not None and value not in meta["choices"]:
            raise ConfigError(f"unknown {f.name} '{value}'; choose from: {', '.join(meta['choices'])}")
        if meta.get("parse") is not None:
            try:
                meta["parse"](str(value))
            except (argparse.ArgumentTypeError, ValueError):
                raise ConfigError(f"{f.name} must be {meta['parse'].__name__}, got {value}") from None


def paper_and_data(cfg: TrainConfig):
    """The paper's spec for the config's flavor, and the data set's; a ConfigError for an unknown one."""
    from common.data import get_dataset
    from common.pretrained import is_run
    from papers import get_paper

    try:
        spec = get_paper(cfg.paper)
        data = get_dataset(cfg.dataset, cfg.hf_columns, cfg.data_dir, online=cfg.download)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if (cfg.init is None or is_run(cfg.init)) and cfg.flavor not in spec.flavors:
        raise ConfigError(f"unknown flavor '{cfg.flavor}' for {spec.name}; choose from: {', '.join(spec.flavors)}")
    check_model_kwargs(spec, cfg)
    return spec.for_flavor(cfg.flavor), data


def check_training(cfg: TrainConfig, device_type: str | None) -> None:
    """The training loop's checks beyond each field's range: the smoothing below 1, the time limit's
    form, fp16 only on CUDA."""
    import torch

    if cfg.label_smoothing >= 1:
        raise ConfigError(f"label_smoothing must be below 1, got {cfg.label_smoothing}")
    if cfg.time_limit is not None:
        try:
            parse_time_limit(cfg.time_limit)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.precision == "fp16" and device_type != "cuda":
        raise ConfigError("fp16 needs a CUDA device; on a CPU use --precision bf16")


def check_model(spec, cfg: TrainConfig, data, facts: dict, variable: bool):
    """The model the config asks for, built on the meta device (nothing real): a flavor that cannot take
    the data set, a --model-kwargs value its class refuses, a run to start from that does not fit,
    --ac on a paper without repeated blocks, and --lora on attention the model has not (common.lora) are
    each one line."""
    import torch

    from common import lora
    from common.pretrained import build_model, check_run, is_run

    if cfg.ac != "none" and not spec.shard_blocks:
        raise ConfigError(f"--ac {cfg.ac} recomputes the activations of a paper's repeated blocks; {spec.name} "
                          f"{cfg.flavor} names none (shard_blocks)")
    try:
        with torch.device("meta"):
            model = build_model(spec, cfg.flavor, cfg.init, facts, cfg.model_kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        if cfg.model_kwargs:
            raise ConfigError(f"{spec.name} {cfg.flavor} with --model-kwargs {describe_kwargs(cfg.model_kwargs)}: "
                              f"{' '.join(str(e).split())}") from None
        raise ConfigError(f"flavor {cfg.flavor} of {spec.name} cannot train on {data.name}: {e}") from None
    if cfg.init_tensors is not None:
        if cfg.init is None or not is_run(cfg.init):
            raise ConfigError("--init-tensors picks tensors of a run to start from; give that run as --init RUN_DIR")
        try:
            re.compile(cfg.init_tensors)
        except re.error as e:
            raise ConfigError(f"--init-tensors {cfg.init_tensors}: not a regular expression ({e})") from None
    if cfg.init is not None and is_run(cfg.init):
        check_run(spec, cfg.init, model, facts, _run_facts(cfg.init), only=cfg.init_tensors)
    if not variable:
        check_image_size(spec, cfg, model, facts)
    multiple = getattr(model, "input_multiple", 1)
    if variable and facts.get("size_multiple", 1) % multiple:
        raise ConfigError(f"flavor {cfg.flavor} of {spec.name} needs image sides that are multiples of {multiple}, "
                          f"but {data.name}'s sides are multiples of {facts.get('size_multiple', 1)}")
    lora.check(cfg, spec, model)
    return model


# what a convolution or pooling says of an input smaller than its window (torch's shape checks, also on meta)
TOO_SMALL = ("Kernel size can't be greater than actual input size", "Output size is too small")


def check_image_size(spec, cfg: TrainConfig, model, facts: dict) -> None:
    """An image classifier run once on the meta device (nothing computed) at the data set's fixed image size:
    an image its stages shrink to nothing (ConvNeXt's ResNet stem at 28x28, say) is one line here rather than a
    traceback from the first step. Errors other than a size the model refuses are left to the run."""
    import torch

    size, chans = facts.get("img_size"), facts.get("in_chans")
    if spec.inputs != "image" or spec.for_flavor(cfg.flavor).task != "classification" or not size or not chans:
        return
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    training = model.training
    try:
        model.eval()
        with torch.device("meta"), torch.no_grad():
            model(torch.empty(2, chans, h, w))
    except NotImplementedError:
        return
    except (ValueError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and not any(s in str(e) for s in TOO_SMALL):
            return
        given = f" with --model-kwargs {describe_kwargs(cfg.model_kwargs)}" if cfg.model_kwargs else ""
        raise ConfigError(f"{spec.name} {cfg.flavor}{given} cannot take {h}x{w} images: "
                          f"{' '.join(str(e).split())}") from None
    finally:
        model.train(training)


def check_out(cfg: TrainConfig, resuming: bool) -> None:
    """--out: a new folder, or the run's own when resuming."""
    if cfg.out is not None:
        out = Path(cfg.out)
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {cfg.out} is a file, not a folder; choose a new folder")
        if (out / "config.json").exists() and not resuming:
            raise ConfigError(f"--out {cfg.out} already holds a run; choose a new folder")


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


def save(cfg: TrainConfig, path: Path) -> None:
    path.write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
