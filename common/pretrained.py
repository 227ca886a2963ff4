"""Fine-tuning from pretrained weights: `--init REF`, a reference implementation's, or `--init RUN_DIR`,
a finished run's of the same paper.

REF names a reference model and where its weights come from:

    timm:NAME           timm.create_model(NAME, pretrained=True): timm's own download and cache
    torchvision:NAME    torchvision.models.get_model(NAME, weights="DEFAULT"): torchvision's
    SOURCE:NAME@FILE    the reference built without weights, then FILE read into it: safetensors
                        (*.safetensors), else a PyTorch file (torch.load, weights_only=True) holding
                        a state dict, plain or under "state_dict" or "model"

The paper's own loader (`PaperSpec.pretrained[SOURCE]`, the parity loader its tests check)
turns the reference into our model, which is then adapted to the data set as the ViT paper
fine-tunes (Section 3.2): a head of another number of classes (or none, as timm's pre-training
weights such as vit_base_patch16_224.orig_in21k) is replaced by a new one, initialised as the
paper initialises it; the position embeddings of a model with another image size are
interpolated to the new patch grid once. Another number of input channels is refused. Every
mistake is a one-line ConfigError; every adaptation is a note line.

RUN_DIR (any value not of the form SOURCE:NAME) is a run directory train.py wrote: the model is the
run's own flavor (--flavor, --model-kwargs), and every tensor of it that the run's model.safetensors
holds under the same name with the same shape is loaded; the others (a new head: GPT's classifier on
a GPT pre-trained as a language model) keep their initialisation, and one line says what was loaded
and what was left new. A folder that is no finished run, a run of another paper, a run none of whose
tensors fit, or one of token data whose vocabulary is not this run's, is refused in one line.
"""

import difflib
import json
import re
from pathlib import Path

import torch
import torch.nn as nn

from common.errors import ConfigError

FORMS = ("timm:NAME, torchvision:NAME, or either as SOURCE:NAME@FILE (weights read from a local file), or RUN_DIR "
         "(a finished run of the same paper)")
REFERENCE = re.compile(r"([^:@\s]+):([^@\s]+)(?:@(.+))?")  # SOURCE:NAME[@FILE]


def is_run(init: str) -> bool:
    """An --init value naming a run directory: an existing folder, or anything not of the form SOURCE:NAME."""
    return Path(init).is_dir() or not REFERENCE.fullmatch(init.strip())


def parse_init(text: str) -> tuple[str, str, Path | None]:
    """(source, model name, weights file or None) of an --init value; ConfigError when malformed."""
    match = REFERENCE.fullmatch(text.strip())
    if not match:
        raise ConfigError(f"--init {text!r} names no reference model; use {FORMS}")
    source, name, file = match.groups()
    if source not in SOURCES:
        raise ConfigError(f"--init {text}: unknown source '{source}'; use {FORMS}")
    return source, name, Path(file) if file else None


def _timm(name: str, pretrained: bool, **kwargs) -> nn.Module:
    import timm

    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        raise ConfigError(f"unknown timm model '{name}'" + (f"; did you mean {', '.join(close)}?" if close else ""))
    if pretrained and not timm.is_model_pretrained(name):
        raise ConfigError(f"timm has no pretrained weights for '{name}'; pass a weights file: timm:{name}@FILE")
    return timm.create_model(name, pretrained=pretrained, **kwargs)


def _torchvision(name: str, pretrained: bool, **kwargs) -> nn.Module:
    import torchvision

    names = torchvision.models.list_models()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3)
        raise ConfigError(f"unknown torchvision model '{name}'"
                          + (f"; did you mean {', '.join(close)}?" if close else ""))
    return torchvision.models.get_model(name, weights="DEFAULT" if pretrained else None, **kwargs)


# source -> (model name, download?, constructor arguments) -> the reference model. A paper's PaperSpec.pretrained
# names which of these it loads from.
SOURCES = {"timm": _timm, "torchvision": _torchvision}


def load_mapped(model: nn.Module, reference: nn.Module, ours_to_theirs: dict[str, str], what: str) -> nn.Module:
    """model with the reference's tensors copied in by name (our name -> theirs), strictly: every
    tensor of the reference mapped, every one of ours found with its shape, else a ValueError that
    names what differs (`what`: "torchvision ResNet", ...)."""
    src, dst = reference.state_dict(), model.state_dict()
    missing = sorted(set(src) - set(ours_to_theirs.values()))
    unmatched = sorted(k for k in dst if k not in ours_to_theirs or ours_to_theirs[k] not in src)
    wrong_shape = sorted(k for k in dst if k not in unmatched and dst[k].shape != src[ours_to_theirs[k]].shape)
    if missing or unmatched or wrong_shape:
        raise ValueError(f"this {what} does not map onto the paper's: tensors of theirs not mapped "
                         f"{missing[:3]}, of ours not found {unmatched[:3]}, of another shape {wrong_shape[:3]}")
    with torch.no_grad():
        model.load_state_dict({ours: src[theirs] for ours, theirs in ours_to_theirs.items()})  # strict
    return model


def _one_line(error: Exception, limit: int = 160) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_weights(file: Path, init: str) -> dict[str, torch.Tensor]:
    """The state dict in a safetensors or PyTorch file."""
    if not file.exists():
        raise ConfigError(f"--init {init}: weights file {file} does not exist")
    if not file.is_file():
        raise ConfigError(f"--init {init}: weights file {file} is not a file")
    kind = "safetensors" if file.suffix == ".safetensors" else "a PyTorch file"
    try:
        if kind == "safetensors":
            from safetensors.torch import load_file

            state = load_file(file, device="cpu")
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # unreadable, truncated, or not weights: the user's file either way
        raise ConfigError(f"--init {init}: cannot read {file} as {kind}: {_one_line(e)}") from e
    if isinstance(state, dict):
        state = next((state[k] for k in ("state_dict", "model") if isinstance(state.get(k), dict)), state)
    if not (isinstance(state, dict) and state
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())):
        raise ConfigError(f"--init {init}: {file} holds no state dict (tensor names -> tensors), plain or under "
                          f"'state_dict' or 'model'")
    return state


def _head_names(reference: nn.Module) -> set[str]:
    """The names of the reference's classifier weights: its last linear layer's."""
    last = [name for name, m in reference.named_modules() if isinstance(m, nn.Linear)][-1:]
    return {f"{last[0]}.weight", f"{last[0]}.bias"} if last else set()


def _load_weights(reference: nn.Module, state: dict[str, torch.Tensor], file: Path, init: str, name: str) -> int | None:
    """Read `state` into the reference; a head of another number of classes (a file fine-tuned on another
    data set) is left out, as the data set gets a new head anyway. Returns that head's classes, or None."""
    own = reference.state_dict()
    missing, unexpected = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
    wrong = sorted(k for k in own.keys() & state.keys() if own[k].shape != state[k].shape)
    head = _head_names(reference)
    if wrong and not missing and not unexpected and set(wrong) <= head and all(
            own[k].shape[1:] == state[k].shape[1:] for k in wrong):
        classes = state[wrong[0]].shape[0]
        with torch.no_grad():
            reference.load_state_dict({k: v for k, v in state.items() if k not in head}, strict=False)
        return classes
    if missing or unexpected or wrong:
        what = [f"{len(missing)} tensors missing ({', '.join(missing[:3])})" if missing else "",
                f"{len(unexpected)} unexpected ({', '.join(unexpected[:3])})" if unexpected else "",
                f"{len(wrong)} of another shape ("
                + "; ".join(f"{k}: {_size(state[k])} in the file, {_size(own[k])} in {name}" for k in wrong[:3]) + ")"
                if wrong else ""]
        raise ConfigError(f"--init {init}: {file} does not hold the weights of {name}: "
                          + ", ".join(w for w in what if w))
    with torch.no_grad():
        reference.load_state_dict(state)
    return None


def _size(t: torch.Tensor) -> str:
    return "x".join(map(str, t.shape)) or "a scalar"


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else tuple(size)


def _adapt(model: nn.Module, spec, facts: dict, init: str, headless: bool, unused_head: int | None = None,
           fresh: set[str] | None = None) -> list[str]:
    """Fit a loaded model to the data set's facts (those the paper's model is built for); the notes.
    headless: the reference came without a head, so the model needs a new one whatever its size;
    unused_head: the classes of a head in the weights file that was not read (likewise); fresh: where given, the
    names of the parameters of a new head are added to it."""
    notes = []
    if "in_chans" in spec.data_kwargs and model.in_chans != facts["in_chans"]:
        raise ConfigError(f"--init {init}: the model reads {model.in_chans} input channels, the data set has "
                          f"{facts['in_chans']}")
    if "img_size" in spec.data_kwargs and tuple(model.img_size) != _pair(facts["img_size"]):
        (h, w), (H, W) = model.img_size, _pair(facts["img_size"])
        try:
            model.resize_position_embeddings((H, W))
        except ValueError as e:
            raise ConfigError(f"--init {init}: cannot fine-tune at {H}x{W}: {e}") from e
        notes.append(f"--init {init}: position embeddings learned on {h}x{w} images interpolated to {H}x{W} "
                     f"(once, 2D bicubic)")
    classes = model.get_classifier().out_features
    if headless or unused_head is not None or ("num_classes" in spec.data_kwargs and classes != facts["num_classes"]):
        n = facts.get("num_classes", classes)
        before = {id(p) for p in model.parameters()}
        model.reset_classifier(n)
        if fresh is not None:
            fresh.update(name for name, p in model.named_parameters() if id(p) not in before)
        what = ("it has no head (pre-training weights): a new one" if headless
                else f"the file's head of {unused_head} classes not used: a new one" if unused_head is not None
                else f"head of {classes} classes replaced by a new one")
        notes.append(f"--init {init}: {what} of {n} classes, initialised as the paper's")
    return notes


def reference_model(spec, init: str, facts: dict, weights: bool = True,
                    fresh: set[str] | None = None) -> tuple[nn.Module, list[str]]:
    """The paper's model holding a reference model's pretrained weights, fitted to a data set.

    Args:
        spec: the paper (papers.PaperSpec); its `pretrained` loaders say which sources it reads.
        init: the --init value (see `parse_init`).
        facts: the data set's facts (num_classes, in_chans, img_size, ...; common.data.DatasetSpec).
        weights: False builds the same architecture without weights: the reference created
            without pretrained weights, no download, no file read (to rebuild the model for a
            resume, an export or a FLOP count). Parameter names and shapes are those of True.
        fresh: where given, the names of the parameters not read from the reference (a new head) are
            added to it (what --lora trains with its update).

    Returns:
        The model, and notes (one line each) saying what was adapted to the data set.
    """
    source, name, file = parse_init(init)
    loader = spec.pretrained.get(source)
    if loader is None:
        has = ", ".join(f"{s}:NAME" for s in spec.pretrained) or "none: it trains from scratch only"
        raise ConfigError(f"--init {init}: paper {spec.name} has no loader for {source} weights (it has: {has})")
    missing = [k for k in spec.data_kwargs if k not in facts]
    if missing:
        raise ValueError(f"{spec.name} needs {', '.join(missing)} from the dataset, which does not give it")

    state = _read_weights(file, init) if weights and file is not None else None
    download = weights and file is None
    try:
        reference = SOURCES[source](name, pretrained=download)
    except ConfigError as e:  # an unknown model name
        raise ConfigError(f"--init {init}: {e}") from None
    except OSError as e:  # timm (huggingface_hub) and torchvision (urllib) both raise one when offline
        if not download:
            raise
        raise ConfigError(f"--init {init}: cannot fetch the {source} weights of {name}, nor find them in its cache "
                          f"({type(e).__name__}); download them where there is a network, or pass a local copy: "
                          f"--init {source}:{name}@FILE") from e
    unused_head = _load_weights(reference, state, file, init, f"{source}:{name}") if state is not None else None
    headless = getattr(reference, "num_classes", None) == 0  # timm's pre-training weights (e.g. *.orig_in21k)
    if headless:
        reference.reset_classifier(facts.get("num_classes", 1))  # a stand-in, replaced below
    try:
        model = loader(reference)
    except ValueError as e:  # a reference with parts the paper's model has not
        raise ConfigError(f"--init {init}: {e}") from e
    return model, _adapt(model, spec, facts, init, headless, unused_head, fresh)


def _run_weights(spec, init: str) -> tuple[Path, dict[str, tuple[int, ...]]]:
    """A finished run's weights file and its tensors' shapes (from the file's header: nothing loaded);
    ConfigError for a folder that is no finished run of this paper."""
    from safetensors import safe_open

    run = Path(init)
    if not run.is_dir():
        raise ConfigError(f"--init {init}: no run directory there, nor a reference model; use {FORMS}")
    try:
        config = json.loads((run / "config.json").read_text())
        paper = config.get("paper")
    except (OSError, ValueError, AttributeError):
        raise ConfigError(f"--init {init}: not a run directory (no readable config.json)") from None
    if paper != spec.name:
        raise ConfigError(f"--init {init}: a run of paper {paper}, not of {spec.name}; start from a run of {spec.name}")
    if config.get("lora") is not None:
        raise ConfigError(f"--init {init}: a LoRA run, whose model.safetensors holds its update alone; start from the "
                          f"run it adapted, {config.get('init')}")
    file = run / "model.safetensors"
    if not file.is_file():
        raise ConfigError(f"--init {init}: the run has no {file.name}: it has not finished (--resume it first)")
    try:
        with safe_open(file, "pt") as f:
            return file, {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # truncated, or not safetensors
        raise ConfigError(f"--init {init}: cannot read {file} as safetensors: {_one_line(e)}") from e


def _fitting(model: nn.Module, shapes: dict[str, tuple[int, ...]], init: str, file: Path,
             only: str | None = None) -> tuple[list, list]:
    """The model's tensors that the file holds by name and shape (and whose names match `only` in full, where
    given: --init-tensors), and the others; ConfigError if none fits."""
    own = model.state_dict()
    fits = [k for k, t in own.items() if shapes.get(k) == tuple(t.shape)]
    if only is not None:
        picked = [k for k in fits if re.fullmatch(only, k)]
        if not picked:
            raise ConfigError(f"--init-tensors {only}: none of the {len(fits)} tensors of {file} that fit this model "
                              f"matches ({', '.join(fits[:4])}{', ...' if len(fits) > 4 else ''})")
        return picked, [k for k in own if k not in picked]
    if not fits:
        raise ConfigError(f"--init {init}: none of the {len(shapes)} tensors of {file} fits this model by name and "
                          f"shape (the model's: {', '.join(list(own)[:3])}, ...; the file's: "
                          f"{', '.join(list(shapes)[:3])}, ...)")
    return fits, [k for k in own if k not in fits]


def _vocabulary(facts: dict):
    """What a token data set's ids mean (its characters, or its BPE); None for other data."""
    return (facts.get("level"), facts.get("itos"), facts.get("tokenizer")) if "vocab_size" in facts else None


def check_run(spec, init: str, model: nn.Module, facts: dict, theirs: tuple[dict, str] | None = None,
              only: str | None = None) -> None:
    """--init RUN_DIR's checks, before a run starts (model may be on the meta device): a finished run of
    this paper, a tensor that fits, and, where both are token data, the same tokens: theirs is the run's
    data set's facts and what it read (its data set and tokenizer, for the message), as common.config
    reads them from the run's config; None where it no longer reads."""
    file, shapes = _run_weights(spec, init)
    _fitting(model, shapes, init, file, only)
    if theirs is None:
        return
    their_facts, read = theirs
    if _vocabulary(facts) is not None and _vocabulary(their_facts) not in (None, _vocabulary(facts)):
        raise ConfigError(f"--init {init}: the run read other tokens ({read}, {their_facts['vocab_size']} of them) "
                          f"than this data set's ({facts['vocab_size']}): its embeddings would read other tokens; "
                          f"pre-train on this data set's tokenizer")


def load_from_run(model: nn.Module, spec, init: str, only: str | None = None,
                  fresh: set[str] | None = None) -> list[str]:
    """--init RUN_DIR: every tensor of model that the run's model.safetensors holds by name and shape (and, with
    --init-tensors, whose name matches `only` in full), copied in (the rest keep their initialisation).
    Returns the note line saying what was loaded and left new; fresh: where given, the names of the parameters
    left new are added to it (what --lora trains with its update)."""
    from safetensors.torch import load_file

    file, shapes = _run_weights(spec, init)
    fits, new = _fitting(model, shapes, init, file, only)
    state = load_file(file, device="cpu")
    with torch.no_grad():
        model.load_state_dict({k: state[k] for k in fits}, strict=False)
    unused = [k for k in shapes if k not in fits]
    if fresh is not None:
        fresh.update(name for name, _ in model.named_parameters() if name in new)
    return [f"--init {init}: {len(fits)} tensors loaded from {file}; left new: {', '.join(new) or 'none'}"
            + (f"; not used from the file: {', '.join(unused)}" if unused else "")]


def check_teacher(cfg, spec, data, facts: dict, theirs: tuple[dict, str] | None) -> None:
    """--teacher RUN_DIR and --distillation, before a run starts: a pair or neither, a student whose paper
    takes a teacher (a model class with `takes_teacher`: DeiT's), no --pp (the teacher labels whole
    batches), and a finished run of a classifier trained on the same data set, images and classes (`theirs`:
    the teacher's data set's facts, as common.config reads them from its config; None where it does not read)."""
    if cfg.teacher is not None and cfg.distillation == "none":
        raise ConfigError("--teacher RUN_DIR needs --distillation soft or hard")
    if cfg.teacher is None:
        if cfg.distillation != "none":
            raise ConfigError(f"--distillation {cfg.distillation} needs a --teacher RUN_DIR")
        return
    if not getattr(spec.model, "takes_teacher", False):
        raise ConfigError(f"--teacher: {spec.name} has no distillation head; a teacher trains a student that has "
                          f"one (deit)")
    if cfg.pp > 1:
        raise ConfigError("--teacher labels whole batches, which --pp cuts into stages; train without --pp")
    run = Path(cfg.teacher)
    if not (run / "config.json").is_file() or not (run / "model.safetensors").is_file():
        raise ConfigError(f"--teacher {cfg.teacher}: not a finished run (it needs config.json and "
                          f"model.safetensors)")
    config = json.loads((run / "config.json").read_text())
    their = (config.get("dataset"), config.get("image_size"))
    if their != (data.name, cfg.image_size):
        raise ConfigError(f"--teacher {cfg.teacher}: trained on {their[0]} (--image-size {their[1]}), this run on "
                          f"{data.name} (--image-size {cfg.image_size}); a teacher reads the student's images")
    their_facts = (theirs or ({},))[0]
    if data.task != "classification" or their_facts.get("num_classes") != facts.get("num_classes"):
        raise ConfigError(f"--teacher {cfg.teacher}: a teacher classifies the student's classes ("
                          f"{facts.get('num_classes')}); it has {their_facts.get('num_classes')}")


def architecture_name(init: str) -> str:
    """What stands in for --flavor in a run started from a reference: SOURCE:NAME (without the file)."""
    source, name, _ = parse_init(init)
    return f"{source}:{name}"


def build_model(spec, flavor: str, init: str | None, facts: dict, model_kwargs: dict | None = None) -> nn.Module:
    """The model a run trains: the flavor's (with `model_kwargs`, --model-kwargs, over its arguments; also
    with --init RUN_DIR), or with --init REF the reference's architecture (random weights, nothing
    downloaded or read: `reference_model(..., weights=False)`)."""
    if init is None or is_run(init):
        return spec.build_for_data(flavor, facts, model_kwargs)
    return reference_model(spec, init, facts, weights=False)[0]
