"""The data's checks of a config (common.config.validate asks them): the flags that only some data sets
take, the augmentation, and whether the paper can read the data set's samples. Nothing is written here:
a data set that is missing is one line saying how to get it (`--download` fetches it, in train.py,
before these checks)."""

from common.errors import ConfigError

SHARED_HEAD = {"classification", "regression"}  # tasks whose models are alike: a head of num_classes outputs


def check(cfg, data, spec) -> tuple[dict, bool]:
    """The data set's facts (ConfigError when its files are missing) and whether its samples differ in
    size; a ConfigError for the first flag that does not apply to it."""
    from common.data import DATASETS, options
    from common.data.augment import JOINT_STEPS
    from common.data.augment import parse as parse_augment

    check_options(cfg, data, spec)
    try:
        augment_steps = parse_augment(data.training_augment(cfg.augment))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.image_size is not None and not data.resizable:
        resizable = ", ".join(name for name, d in DATASETS.items() if d.resizable)
        raise ConfigError(f"--image-size does not apply to {data.name}; it resizes {resizable}")
    facts = data.facts(**options(cfg))  # ConfigError when the data is missing
    variable = data.is_variable(cfg.image_size)
    check_recipe_steps(cfg, data, dict(augment_steps))
    if variable and not spec.padded_batches:
        raise ConfigError(fixed_size_fix(spec, data))
    joint = [name for name, _ in augment_steps if name in JOINT_STEPS]
    if joint and data.task != "segmentation":
        raise ConfigError(f"--augment {data.training_augment(cfg.augment)}: {joint[0]} warps a segmentation "
                          f"sample's image and target maps together; {data.name} is a {data.task} data set")
    if [s for s in augment_steps if s[0] not in JOINT_STEPS] and (data.inputs != "image" or variable):
        raise ConfigError(f"--augment {data.training_augment(cfg.augment)} transforms images of one size; "
                          f"{data.name} has {'images of many sizes' if variable else data.inputs + 's'}"
                          + (" (elastic:STD warps a segmentation sample of any size)" if data.task == "segmentation"
                             else ""))
    check_tta(cfg.tta, data, variable)
    if cfg.bucketing == "size" and not variable:
        variable_sets = ", ".join(name for name, d in DATASETS.items() if d.variable_size)
        resized = " once --image-size resizes it" if data.variable_size else ""
        raise ConfigError(f"--bucketing size needs samples of different sizes; {data.name} has one size{resized} "
                          f"(variable-size data sets: {variable_sets})")
    return facts, variable


def check_tta(tta: str, data, variable: bool) -> None:
    """--tta flip: image classification on images of one size."""
    if tta != "none" and (data.task != "classification" or data.inputs != "image" or variable):
        kind = (f"is a {data.task} data set" if data.task != "classification" else
                f"has {data.inputs} inputs" if data.inputs != "image" else "has images of many sizes")
        raise ConfigError(f"--tta {tta} averages the logits of a test image and its mirror image, for "
                          f"classification of images of one size; {data.name} {kind}")


def check_recipe_steps(cfg, data, steps: dict) -> None:
    """DeiT's augmentation steps (common.data.augment), each where it applies: mixup and cutmix mix the labels
    of classification data sets, randaug needs the pixels' normalisation (DatasetSpec.preprocess), repeat
    samples a data set read by index and not by size buckets."""
    from common.data import options

    given = data.training_augment(cfg.augment)
    mixes = [name for name in ("mixup", "cutmix") if name in steps]
    if mixes and data.task != "classification":
        raise ConfigError(f"--augment {given}: {' and '.join(mixes)} mix the labels of classification data sets; "
                          f"{data.name} is a {data.task} data set")
    if "randaug" in steps and (data.preprocess is None or "mean" not in data.preprocess(**options(cfg))):
        raise ConfigError(f"--augment {given}: randaug works on the 8-bit pixels, and {data.name} does not say how "
                          f"its images were normalised")
    if "repeat" in steps and (cfg.bucketing != "none" or data.streamed):
        raise ConfigError(f"--augment {given}: repeat samples a data set by index in a random order; "
                          f"{'--bucketing size' if cfg.bucketing != 'none' else data.name + ' is streamed'} "
                          f"orders it otherwise")


def check_options(cfg, data, spec) -> None:
    """The flags that apply to some data sets only, each against this one."""
    from common.data import DATASETS

    if (cfg.hf_split is not None or cfg.hf_columns is not None) and "hf_split" not in data.options:
        raise ConfigError(f"--hf-split and --hf-columns choose the splits and columns of a Hugging Face data set "
                          f"(--dataset hf:NAME_OR_PATH); {data.name} is not one")
    if data.inputs != spec.inputs:
        raise ConfigError(f"{spec.name} reads {spec.inputs} inputs but dataset {data.name} has {data.inputs} inputs")
    if data.task != spec.task and not {data.task, spec.task} <= SHARED_HEAD:
        fits = ", ".join(name for name, d in DATASETS.items() if d.task == spec.task and d.inputs == spec.inputs)
        raise ConfigError(f"{spec.name} is a {spec.task} model, and {data.name} a {data.task} data set; train it on "
                          f"a {spec.task} data set ({fits})")
    if cfg.train_fraction < 1 and data.streamed:
        raise ConfigError(f"--train-fraction takes a fixed share of samples by index; {data.name} streams its "
                          f"training set: write shards of the share instead")
    if cfg.seq_len is not None and "seq_len" not in data.options:
        takes = ", ".join(name for name, d in DATASETS.items() if "seq_len" in d.options)
        raise ConfigError(f"--seq-len sets the length of generated sequences ({takes}); {data.name} has its own")
    if (cfg.beam != 1 or cfg.length_penalty) and data.task != "seq2seq":
        raise ConfigError(f"--beam and --length-penalty decode sequences; {data.name} is a {data.task} data set")
    check_tokens(cfg, data, spec)


def check_tokens(cfg, data, spec) -> None:
    """--block-size, --tokenizer and --vocab-size: text data sets' own."""
    if cfg.block_size is not None and data.inputs != "tokens":
        raise ConfigError(f"--block-size cuts text into samples; {data.name} has {data.inputs} inputs")
    if (cfg.tokenizer != "char" or cfg.vocab_size is not None) and data.inputs == "tokens" \
            and "tokenizer" not in data.options:
        raise ConfigError(f"--tokenizer and --vocab-size do not apply to {data.name}: its tokenizer comes with its "
                          f"data (--data-dir's meta.json)")
    if cfg.tokenizer != "char" and data.inputs != "tokens":
        raise ConfigError(f"--tokenizer {cfg.tokenizer} splits text into tokens; {data.name} has {data.inputs} inputs")
    if cfg.vocab_size is not None and cfg.tokenizer == "char":
        raise ConfigError("--vocab-size sizes a BPE vocabulary; add --tokenizer bpe (or --tokenizer wordpiece: "
                          "a WordPiece vocabulary)")
    if cfg.vocab_size is not None and cfg.tokenizer == "bpe" and cfg.vocab_size <= 256:
        raise ConfigError(f"--vocab-size {cfg.vocab_size}: a byte-level BPE holds the 256 bytes and its merges; "
                          f"use more than 256")
    positions = spec.flavors.get(cfg.flavor, {}).get("block_size")  # a language model's learned positions
    if cfg.block_size is not None and positions is not None and cfg.block_size > positions:
        raise ConfigError(f"--block-size {cfg.block_size} exceeds the {positions} positions of {spec.name} {cfg.flavor}")


def fixed_size_fix(spec, data) -> str:
    """Why a paper that reads one size cannot train on a data set of many, and what to do instead."""
    from common.data import DATASETS

    fixed = ", ".join(name for name, d in DATASETS.items() if d.inputs == data.inputs and not d.variable_size)
    resize = "add --image-size N to resize them all to N x N, or " if data.resizable else ""
    return (f"{spec.name} reads batches of one size (its PaperSpec does not set padded_batches), but the "
            f"{data.inputs}s of {data.name} differ in size: {resize}use a fixed-size data set ({fixed})")
