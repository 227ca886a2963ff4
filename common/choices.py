"""The values a flag may take, in one place that imports nothing heavy.

`train.py --help` and a mistyped flag are answered from these without importing torch
(docs/performance.md); each feature module imports its own names from here, so that the
command line and the code that acts on a value cannot disagree.
"""

STRATEGIES = ("auto", "single", "dp", "ddp", "fsdp")  # common.parallel
AC_MODES = ("none", "full", "selective")  # common.activations
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved")  # common.pipeline
STAGES_PER_RANK = {"gpipe": 1, "1f1b": 1, "interleaved": 2}
DISTILLATIONS = ("none", "soft", "hard")  # common.tasks: DeiT's losses with a --teacher
OPTIMIZERS = ("adamw", "sgd", "rmsprop")  # common.optim
SCHEDULES = ("cosine", "step", "exponential", "constant", "noam")
LR_SCALINGS = ("linear", "sqrt", "none")  # common.batchsize
TOKENIZERS = ("char", "bpe", "wordpiece")  # common.data.text
BPE_VOCAB_SIZE = 1024  # --vocab-size's default: 256 bytes and 768 merges (BPE); WordPiece's too
HF_PREFIX = "hf:"  # a Hugging Face data set: hf:NAME_OR_PATH[:CONFIG] (common.data.hf)
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")  # common.mesh
LORA_TARGETS = ("q", "k", "v", "o", "qkv")  # common.lora: W_q, W_k, W_v, W_o, and one update over a fused W_qkv

# The data sets that --data-dir reads from disk, and those --download fetches: named in --help
# (tests/test_help.py checks these against common.data's registry).
READS_FOLDER = ("pairs", "text", "tokens", "wds", "cifar10", "mnist", "fashion-mnist", "fashion-mnist-rows",
                "fashion-canvas", "coco", "imagefolder", "segfolder")
FETCHED = ("cifar10", "mnist", "fashion-mnist")
