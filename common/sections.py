"""The training configuration's sections, one dataclass each, as the `--help` groups: each field is
described once, in its `opt(...)`, and the command line is generated from them (common.config).

`opt(default, help, ...)` is a dataclass field whose metadata says how its flag reads a value (`parse`,
`choices`), whether it may change when a run is resumed (`resumable`: how a run runs, not what it
computes) or rerun (`rerunnable`: where it goes), and `flag=False` for a field set by code, not by the
command line. Nothing here imports torch.
"""

import dataclasses
from dataclasses import dataclass

from common.choices import (AC_MODES, BPE_VOCAB_SIZE, DISTILLATIONS, FETCHED, LR_SCALINGS, OPTIMIZERS, PP_SCHEDULES, READS_FOLDER,
                            SCHEDULES, STRATEGIES, TOKENIZERS)
from common.flags import (ModelKwargs, batch_size_arg, fraction_arg, lora_targets_arg, non_negative_float,
                          non_negative_int, positive_float, positive_int)

PRECISIONS = ("fp32", "bf16", "fp16")
NONFINITE = ("stop", "skip")  # what a NaN or infinite loss does
BUCKETING = ("none", "size")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
WANDB_MODES = ("auto", "online", "offline", "disabled")
RECIPES = ("repo", "paper")
PIXEL_WEIGHTS = ("paper", "none")  # segmentation: the paper's own weight of each pixel in the loss, or none
TTA = ("none", "flip")  # test-time augmentation of image classification


def opt(default=dataclasses.MISSING, help=None, *, parse=None, choices=None, metavar=None, resumable=False,
        rerunnable=False, flag=True, factory=dataclasses.MISSING, action=None, nargs=None):
    """A config field and its flag, described once."""
    metadata = dict(help=help, parse=parse, choices=choices, metavar=metavar, resumable=resumable,
                    rerunnable=rerunnable, flag=flag, action=action, nargs=nargs)
    return dataclasses.field(default=default, default_factory=factory, metadata=metadata)


@dataclass
class Run:
    """what to run, and where it goes"""
    paper: str = opt(help="which paper (see --list)")
    out: str | None = opt(None, "the run directory, which must not hold a run yet (default runs/<paper>-<time>-<id>)",
                          rerunnable=True)


@dataclass
class Model:
    flavor: str = opt("tiny", "model flavor; 'tiny' (default) or the paper's own sizes")
    init: str | None = opt(None, "start from a reference model's pretrained weights: timm:NAME, torchvision:NAME, or "
                           "either as SOURCE:NAME@FILE (it takes the place of --flavor); or from a finished run of the "
                           "same paper, RUN_DIR: the tensors of --flavor's model that its model.safetensors holds by "
                           "name and shape (a pre-trained body; a new head stays new); a {seed} in RUN_DIR is this "
                           "run's --seed (a sweep's runs each start from the run of their own seed)", metavar="REF")
    init_tensors: str | None = opt(None, "with --init RUN_DIR: copy only the run's tensors whose names match this "
                                   "regular expression in full; the others keep their initialisation (VGG's deeper "
                                   "nets from net A: 'blocks\\.[01]\\.0\\..+|blocks\\.2\\.[02]\\..+|fc[678]\\..+')",
                                   metavar="REGEX")
    model_kwargs: dict = opt(help="override the flavor's constructor arguments, each value a Python literal or a "
                             "plain string (activation=tanh shortcut=none hidden_size=64)", factory=dict,
                             action=ModelKwargs, nargs="+", metavar="KEY=VALUE")


@dataclass
class LoRA:
    """low-rank adaptation (papers/lora, Hu et al. 2021): with --init, train an update W_0 + (alpha / r) B A of the
    attention projections alone, every weight --init loaded frozen (common.lora)"""
    lora: int | None = opt(None, "fine-tune a low-rank update of rank RANK alone: the weights --init loaded stay "
                           "frozen, what it left new (a new head) trains with the update; checkpoints and "
                           "model.safetensors hold what trains, and python -m common.export writes the model merged",
                           parse=positive_int, metavar="RANK")
    lora_alpha: float = opt(8.0, "with --lora: the update is scaled by ALPHA / RANK; ALPHA stays as RANK varies, as "
                            "the paper sets it to the first rank it tries and does not tune it (default 8)",
                            parse=positive_float, metavar="ALPHA")
    lora_targets: str = opt("q,v", "with --lora: the attention matrices adapted, a comma list of q, k, v, o (W_q, W_k, "
                            "W_v, W_o; each its own update, within a fused W_qkv too), or qkv: one update over a fused "
                            "W_qkv (peft's on GPT-2's c_attn); default q,v, the paper's choice (its Table 5)",
                            parse=lora_targets_arg, metavar="TARGETS")


_FOLDERS, _FETCHED = ", ".join(READS_FOLDER), ", ".join(FETCHED)


@dataclass
class Data:
    dataset: str = opt("digits", "dataset name, or hf:NAME_OR_PATH[:CONFIG] for a Hugging Face data set (a "
                       "save_to_disk folder, parquet or arrow files, or a Hub data set in the local cache); the "
                       "paper's default if left out")
    data_dir: str | None = opt(None, f"the folder (or file) that a data set read from disk is read from: {_FOLDERS}; "
                               f"for wds a pattern of shards ('DIR/train-{{000000..000009}}.tar'); for hf: data sets, "
                               f"the Hugging Face cache (default: datasets' own)")
    download: bool = opt(False, f"fetch {_FETCHED} into --data-dir (default data/), or an hf: Hub data set into the "
                         f"Hugging Face cache, first", resumable=True)
    hf_split: str | None = opt(None, "hf: data sets: the splits to train and test on (default train,test, or the only "
                               "split cut 80/20); one name: that split cut 80/20 into train and test",
                               metavar="TRAIN[,TEST]")
    hf_columns: str | None = opt(None, "hf: data sets: the columns to read, which set the task: image=COL,label=COL "
                                 "(classification), text=COL (language modeling) or source=COL,target=COL (seq2seq); "
                                 "default: from the column names (image or img and label; text; source and target)",
                                 metavar="ROLE=COLUMN,...")
    train_fraction: float = opt(1.0, "train on a fixed share F of the training split (the same samples for every "
                                "seed; a smaller share is part of a larger one); the test split is whole",
                                parse=fraction_arg, metavar="F")
    image_size: int | None = opt(None, "resize images to N x N (image data sets but the detection ones)",
                                 parse=positive_int)
    augment: str = opt("auto", "training-image augmentation: scale:LO-HI, rrc:MIN, crop:P, flip, lighting:S, or none; "
                       "auto (default): the data set's own, crop:4,flip for fashion-mnist, crop:4 for mnist, none "
                       "for the others")  # the trainer writes the data set's own into config.json in auto's place
    pad_multiple: int = opt(1, "round padded sizes up to a multiple of N", parse=positive_int)
    bucketing: str = opt("none", "size: batch samples of similar size together", choices=BUCKETING)
    block_size: int | None = opt(None, "text data sets: tokens a sample reads (default: the data set's, 128)",
                                 parse=positive_int)
    seq_len: int | None = opt(None, "generated sequences (adding-1997): the minimal length T (default 100)",
                              parse=positive_int, metavar="T")
    tokenizer: str = opt("char", "text data sets but tokens (whose meta.json holds its own): char (default), bpe: "
                         "a byte-level BPE trained on the training split, or wordpiece: BERT's WordPiece trained "
                         "so; saved in the run directory as tokenizer.json", choices=TOKENIZERS)
    vocab_size: int | None = opt(None, f"--tokenizer bpe or wordpiece: its vocabulary (BPE: 256 bytes and the merges; "
                                 f"default {BPE_VOCAB_SIZE})", parse=positive_int)
    num_workers: int = opt(0, "DataLoader worker processes", parse=non_negative_int, resumable=True)


@dataclass
class Training:
    epochs: int = opt(10, "passes over the training split", parse=positive_int)
    max_steps: int | None = opt(None, "stop after this many optimizer steps", parse=positive_int)
    batch_size: int | str = opt(64, "global batch, whatever the number of processes; auto: the largest that fits",
                                parse=batch_size_arg)
    grad_accum: int = opt(1, "micro-steps per optimizer step", parse=positive_int)
    precision: str = opt("fp32", "fp32 (default); bf16 or fp16: autocast (fp16 with a gradient scaler, CUDA only)",
                         choices=PRECISIONS)
    label_smoothing: float = opt(0.0, "tasks with classes: the smoothing of the training loss (default 0)",
                                 parse=non_negative_float)
    pixel_weights: str = opt("paper", "segmentation: each labelled pixel's weight in the training loss: paper "
                             "(default), the paper's own where it has one (U-Net's weight map of equation 2), else "
                             "1; none: 1 for every pixel", choices=PIXEL_WEIGHTS)
    teacher: str | None = opt(None, "knowledge distillation (DeiT): a finished run on the same data set, of any "
                              "paper, whose model (in eval mode, without gradients) labels each training batch for "
                              "--distillation; only a student with a distillation head takes one (deit)",
                              metavar="RUN_DIR")
    distillation: str = opt("none", "with --teacher: soft (Eq. 2: (1 - lambda) CE + lambda tau^2 KL) or hard (1/2 CE "
                            "with the label + 1/2 CE with the teacher's argmax), on the distillation head where the "
                            "student has one, else on its class head (DeiT, Section 4)", choices=DISTILLATIONS)
    distillation_tau: float = opt(3.0, "--distillation soft: the temperature tau (default 3)", parse=positive_float,
                                  metavar="TAU")
    distillation_lambda: float = opt(0.1, "--distillation soft: the weight lambda of the KL term (default 0.1)",
                                     parse=fraction_arg, metavar="LAMBDA")
    seed: int = opt(0, parse=non_negative_int)
    nonfinite: str = opt("stop", "a NaN or infinite loss: stop (default; exit code 65) or skip that step's update on "
                         "every rank", choices=NONFINITE, resumable=True)
    nonfinite_patience: int = opt(10, "with --nonfinite skip: stop after this many skipped steps in a row (default "
                                  "10)", parse=positive_int, resumable=True)


@dataclass
class Optimization:
    recipe: str = opt("repo", "repo (default): the paper's defaults here (mostly AdamW, warmup, cosine); paper: the "
                      "paper's own (PaperSpec.recipe)", choices=RECIPES)
    optimizer: str = opt("adamw", choices=OPTIMIZERS)
    lr: float = opt(1e-3, "peak learning rate", parse=positive_float)
    lr_scaling: str = opt("linear", "the learning rate follows the batch size from the paper's (or its recipe's) "
                          "batch: linear (default; Goyal et al., with a warmup of at least 5 epochs when it grows), "
                          "sqrt, or none", choices=LR_SCALINGS)
    lr_batch: int | None = opt(None, "the batch --lr is given for: the paper's (or its recipe's); None: any",
                               flag=False)
    momentum: float = opt(0.9, "sgd's and rmsprop's momentum", parse=non_negative_float)
    nesterov: bool = opt(False, "sgd with Nesterov momentum")
    weight_decay: float = opt(0.05, parse=non_negative_float)
    clip_grad: float = opt(0.0, "max gradient norm; 0 turns it off", parse=non_negative_float)
    warmup_steps: int = opt(0, parse=non_negative_int)
    schedule: str = opt("cosine", "after warmup: cosine, step, exponential, constant; noam: the Transformer's warmup "
                        "then 1/sqrt(step) decay", choices=SCHEDULES)
    milestones: str | None = opt(None, "step schedule: fractions of the run where lr is multiplied by gamma")
    gamma: float = opt(0.1, "step: the factor at each milestone; exponential: per epoch", parse=positive_float)
    gammas: str | None = opt(None, "step: one factor per milestone, e.g. 0.4,0.5 (instead of one gamma)")


@dataclass
class Evaluation:
    eval_samples: int | None = opt(None, "evaluate on a fixed N of the test split's samples (the same for every run and "
                                   "process count): a quick check, whose figures are not the data set's, so the "
                                   "leaderboard leaves such runs out; default: the whole split", parse=positive_int,
                                   metavar="N")
    beam: int = opt(1, "seq2seq: evaluate by beam search of this width (default 1: greedy)", parse=positive_int)
    length_penalty: float = opt(0.0, "beam search: rank by log p / ((5 + length) / 6)^ALPHA (the Transformer's 0.6; "
                                "default 0)", parse=non_negative_float)
    tta: str = opt("none", "image classification: none (default), or flip: score each test image by the mean of "
                   "its logits and its mirror image's (left to right)", choices=TTA)


@dataclass
class Parallelism:
    """applied in common/parallelize.py in one order: the pipeline's split, tensor parallel, activation
    checkpointing, compile, then the data-parallel wrapping"""
    strategy: str = opt("auto", "auto: ddp under torchrun with >1 process, else single", choices=STRATEGIES,
                        resumable=True)
    dp_replicate: int | None = opt(None, "data parallel: copies of the model that average their gradients (with "
                                   "--dp-shard: HSDP); the mesh's sizes multiply to the processes",
                                   parse=positive_int, resumable=True)
    dp_shard: int | None = opt(None, "data parallel: ranks that shard the model, its gradients and optimizer state "
                               "(FSDP2)", parse=positive_int, resumable=True)
    tp: int = opt(1, "tensor parallel: split the linear layers of the paper's tp_plan over this many neighbouring "
                  "processes (vit, deit, swin, gpt, bert, transformer)", parse=positive_int, resumable=True)
    sequence_parallel: bool = opt(False, "with --tp: split the positions between the split layers (the norms, "
                                  "residual adds and dropouts) over the ranks too (pre-norm blocks: vit, gpt's GPT-2 "
                                  "flavors)", resumable=True)
    pp: int = opt(1, "pipeline parallel: cut the paper's blocks into stages on this many processes, the embedding "
                  "with the first, the head and loss with the last (convnext, deit, gpt, resnet, resnext, swin, vgg, vit)", parse=positive_int,
                  resumable=True)
    pp_schedule: str = opt("1f1b", "with --pp: gpipe, 1f1b (default) or interleaved (two stages per process)",
                           choices=PP_SCHEDULES, resumable=True)
    microbatches: int | None = opt(None, "with --pp: pieces of each process's batch that flow through the stages "
                                   "(default: --pp)", parse=positive_int, resumable=True)
    ac: str = opt("none", "activation checkpointing: each of the paper's blocks (full) or every other block "
                  "(selective) recomputes its activations in backward (default none)", choices=AC_MODES,
                  resumable=True)
    compile: bool = opt(False, "torch.compile the model", resumable=True)
    compile_mode: str = opt("default", "torch.compile mode (with --compile)", choices=COMPILE_MODES, resumable=True)
    compile_backend: str = opt("inductor", "torch.compile backend (with --compile; eager and aot_eager check tracing "
                               "only)", choices=COMPILE_BACKENDS, resumable=True)


@dataclass
class Checkpoints:
    ckpt_every: int | None = opt(None, "steps between checkpoints (default: each epoch's end)", parse=positive_int,
                                 resumable=True)
    keep_ckpts: int = opt(2, "newest checkpoints to keep (default 2)", parse=positive_int, resumable=True)
    time_limit: str | None = opt(None, "stop with a checkpoint (exit code 75) before this much wall time has passed "
                                 "since the start, as SIGTERM and SIGUSR1 do (a job's limit)", metavar="HH:MM:SS",
                                 resumable=True)


@dataclass
class Tracking:
    results_dir: str = opt("results", "the results store finished runs are added to (default results/)",
                           resumable=True, rerunnable=True)
    wandb: str = opt("auto", "auto: online with an API key, else offline", choices=WANDB_MODES, resumable=True,
                     rerunnable=True)
    wandb_project: str = opt("paper-study", rerunnable=True)
    log_every: int = opt(10, "optimizer steps between logged losses", parse=positive_int, resumable=True)
    profile: int = opt(0, "record N training steps with torch.profiler (after 2 warm-up steps) into the run "
                       "directory's profile/", parse=non_negative_int, metavar="N", resumable=True)


# the sections in the order of --help's groups, with each group's title
SECTIONS = {"run": Run, "model": Model, "lora": LoRA, "data": Data, "training": Training,
            "optimization": Optimization, "evaluation": Evaluation, "parallelism": Parallelism,
            "checkpoints": Checkpoints, "tracking and profiling": Tracking}
