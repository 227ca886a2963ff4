"""Token shards (`--dataset tokens --data-dir DIR`): a corpus tokenized once, read from disk.

`python -m common.data.prepare_text` writes DIR: `train.bin` and `test.bin`, the token ids of
the two splits one after another (numpy uint16, or uint32 for a vocabulary beyond 65,536 ids),
and `meta.json`, which says how to read them:

    level         the tokenizer kind, "char", "bpe" or "wordpiece" (as text's facts name it)
    vocab_size    ids 0 .. vocab_size - 1
    dtype         "uint16" or "uint32"
    splits        per split ("train", "test"): tokens, characters, characters_per_token
    itos          char: the vocabulary, <unk> first (text.CharVocab's)
    tokenizer     bpe, wordpiece: the HF tokenizers JSON (text.ByteBPE's, text.WordPiece's)
    token_chars   bpe, wordpiece: the characters each id stands for (for bits per character)
    source        what was tokenized; bpe_sample_* what the BPE was trained on

The files are read through numpy.memmap, a block at a time, so a corpus larger than memory trains:
a sample is a block of `block_size` tokens and the same block shifted by one, the blocks not
overlapping, exactly as text.Blocks cuts a text. The facts are meta.json's, the same as
text.facts gives for the same tokenizer, so bits per character, common.generate and the run's
tokenizer.json work as for `text`. The training blocks are shuffled by samplers.ChunkedOrder
(no permutation of all blocks in memory). The test split is at most EVAL_BLOCKS blocks, spread
evenly over test.bin (block k * n // EVAL_BLOCKS of n), the same every run: a test split of a
large corpus read whole would take hours at every evaluation.
"""

import json
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from common.data.text import BLOCK_SIZE
from common.errors import ConfigError

SPLITS = {"train": "train.bin", "test": "test.bin"}
META = "meta.json"
DTYPES = ("uint16", "uint32")
EVAL_BLOCKS = 1024  # test blocks an evaluation reads, at most
SHUFFLE_CHUNK = 65_536  # training blocks per chunk of the epoch's order (samplers.ChunkedOrder)
# what decodes the ids, per level
DECODES = {"char": ("itos",), "bpe": ("token_chars", "tokenizer"), "wordpiece": ("token_chars", "tokenizer")}


def token_dtype(vocab_size: int) -> str:
    """The narrowest dtype that holds ids 0 .. vocab_size - 1."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def read_meta(data_dir: str | None) -> dict:
    """DIR's meta.json, checked against the .bin files beside it; ConfigError naming what is wrong."""
    if not data_dir:
        raise ConfigError("--dataset tokens reads --data-dir: a folder of train.bin, test.bin and meta.json that "
                          "python -m common.data.prepare_text wrote")
    root = Path(data_dir)
    if not root.is_dir():
        raise ConfigError(f"--dataset tokens: {root} " + ("is not a folder" if root.exists() else "does not exist"))
    if not (root / META).is_file():
        raise ConfigError(f"--dataset tokens: {root} holds no {META}; write the shards with "
                          f"python -m common.data.prepare_text --out {root}")
    try:
        meta = json.loads((root / META).read_text())
        dtype, tokens = meta["dtype"], {split: int(meta["splits"][split]["tokens"]) for split in SPLITS}
        missing = [key for key in ("vocab_size", *DECODES[meta["level"]]) if key not in meta]  # KeyError: a level
        if missing:
            raise KeyError(", ".join(missing))
    except (ValueError, KeyError, TypeError) as e:  # not JSON, or a key missing
        raise ConfigError(f"--dataset tokens: {root / META} is not one that prepare_text wrote "
                          f"({type(e).__name__}: {e})") from None
    if dtype not in DTYPES:
        raise ConfigError(f"--dataset tokens: {root / META} gives dtype '{dtype}'; shards are {' or '.join(DTYPES)}")
    for split, name in SPLITS.items():
        path, size = root / name, tokens[split] * np.dtype(dtype).itemsize
        if not path.is_file():
            raise ConfigError(f"--dataset tokens: {path} is missing")
        if path.stat().st_size != size:
            raise ConfigError(f"--dataset tokens: {path} holds {path.stat().st_size:,} bytes, but {META} says "
                              f"{tokens[split]:,} {dtype} tokens ({size:,} bytes)")
    return meta


def facts(data_dir: str | None = None, block_size: int | None = None, **_) -> dict:
    """What a model is built for, from meta.json: as text.facts gives them for the same tokenizer (char:
    vocab_size, itos, level; bpe: vocab_size, level, token_chars, tokenizer). A split shorter than one
    block is a ConfigError, found here so that validation finds it."""
    meta = read_meta(data_dir)
    _check_blocks(meta, data_dir, block_size or BLOCK_SIZE)
    return {"vocab_size": meta["vocab_size"], "level": meta["level"]} | {k: meta[k] for k in DECODES[meta["level"]]}


def _check_blocks(meta: dict, data_dir: str, block_size: int) -> None:
    for split in SPLITS:
        tokens = meta["splits"][split]["tokens"]
        if tokens < block_size + 1:
            raise ConfigError(f"--dataset tokens: the {split} split of {data_dir} is {tokens:,} tokens, fewer than one "
                              f"block of {block_size} + 1; use a smaller --block-size or more text")


class TokenBlocks(Dataset):
    """Non-overlapping blocks of a .bin file's tokens: sample k is (ids[b*T : b*T+T], ids[b*T+1 : b*T+T+1])
    as int64 tensors, where b is block k, or with `spread` the k-th of `spread` blocks spread evenly.

    Each read maps its own block through a fresh numpy.memmap, as nanoGPT does per batch: one memmap kept
    open accumulates in the process's resident memory the page cache that its faults map (whole large
    folios on recent kernels: 0.5 GB to 1.5 GB after 1,280 random blocks of a 1 GB corpus, measured),
    which reads as a leak; a fresh one costs about 50 microseconds.

    Args:
        path: the .bin file.
        dtype: its numpy dtype.
        block_size: T, the tokens a sample reads.
        spread: read at most this many blocks, block k * n // spread of the file's n (None: all).
    """

    shuffle_chunk = SHUFFLE_CHUNK  # ResumableSampler's order of these blocks: a ChunkedOrder

    def __init__(self, path: Path, dtype: str, block_size: int, spread: int | None = None):
        self.path, self.dtype, self.block_size = Path(path), np.dtype(dtype), block_size
        self.blocks = (self.path.stat().st_size // self.dtype.itemsize - 1) // block_size
        self.spread = spread if spread is not None and spread < self.blocks else None

    def __len__(self) -> int:
        return self.spread or self.blocks

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= k < len(self):
            raise IndexError(k)
        block = k * self.blocks // self.spread if self.spread else k
        window = np.memmap(self.path, self.dtype, mode="r", offset=block * self.block_size * self.dtype.itemsize,
                           shape=(self.block_size + 1,))
        chunk = torch.from_numpy(np.array(window, dtype=np.int64))  # (T + 1,), read; the map is closed with window
        return chunk[:-1], chunk[1:]


def load(data_dir: str | None = None, block_size: int | None = None, **_) -> tuple[TokenBlocks, TokenBlocks]:
    """The training blocks, and at most EVAL_BLOCKS test blocks spread evenly over test.bin."""
    meta, block_size, root = read_meta(data_dir), block_size or BLOCK_SIZE, Path(data_dir)
    _check_blocks(meta, data_dir, block_size)
    return (TokenBlocks(root / SPLITS["train"], meta["dtype"], block_size),
            TokenBlocks(root / SPLITS["test"], meta["dtype"], block_size, spread=EVAL_BLOCKS))
