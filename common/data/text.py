"""Text to model, character by character: the built-in `pydoc` corpus, cut into blocks for a language model.

The corpus is real English that the Python standard library ships: the documentation topics of
`pydoc_data.topics` (the text `help("if")` prints; about 465,000 characters over 79 topics in
Python 3.11), read at run time and never copied into the repository. The split is fixed and by
topic: the topics in sorted order, the first ones (about TRAIN_FRACTION of the characters) for
training and the rest for test, each split's topics joined by blank lines. (Some topics repeat a
paragraph of another, so a few test paragraphs also stand in the training text.)

Character level: one vocabulary over every character of the corpus (both splits, as the dates'
alphabet), after <unk> (id 0), which a typed prompt's unknown characters become. A sample is a block
of `block_size` characters and the same block shifted by one (the next character at every
position); the blocks of a split do not overlap.
"""

from functools import lru_cache

import torch
from torch.utils.data import Dataset

BLOCK_SIZE = 128  # characters a sample reads
TRAIN_FRACTION = 0.9  # of the characters, in whole topics sorted by name
UNK = 0


@lru_cache(maxsize=1)
def corpus() -> tuple[str, str]:
    """(training text, test text) of the pydoc topics."""
    from pydoc_data.topics import topics

    texts = [topics[name].strip() for name in sorted(topics)]
    total, seen, split = sum(len(t) for t in texts), 0, len(texts)
    for i, t in enumerate(texts):
        if seen >= TRAIN_FRACTION * total:
            split = i
            break
        seen += len(t)
    return "\n\n".join(texts[:split]), "\n\n".join(texts[split:])


class CharVocab:
    """Characters <-> ids: <unk> 0, then `chars` in order."""

    def __init__(self, chars: str):
        self.itos = ["<unk>", *chars]
        self.stoi = {c: i for i, c in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        """Ids of the characters; <unk> for a character the vocabulary does not hold."""
        return [self.stoi.get(c, UNK) for c in text]

    def decode(self, ids) -> str:
        return "".join(self.itos[int(i)] if int(i) != UNK else "\ufffd" for i in ids)


@lru_cache(maxsize=1)
def vocab() -> CharVocab:
    train, test = corpus()
    return CharVocab("".join(sorted(set(train) | set(test))))


class Blocks(Dataset):
    """Non-overlapping blocks of a token stream: sample k is (ids[k*T : k*T+T], ids[k*T+1 : k*T+T+1]).

    Args:
        ids: (N,) the split's token ids.
        block_size: T, the tokens a sample reads.
    """

    def __init__(self, ids: torch.Tensor, block_size: int):
        if len(ids) < block_size + 1:
            raise ValueError(f"a split of {len(ids)} tokens holds no block of {block_size} + 1")
        self.ids, self.block_size = ids, block_size

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.block_size

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= k < len(self):
            raise IndexError(k)
        start = k * self.block_size
        chunk = self.ids[start : start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


def load(block_size: int = BLOCK_SIZE, **_) -> tuple[Blocks, Blocks]:
    """The training and test blocks of the pydoc corpus."""
    v = vocab()
    return tuple(Blocks(torch.tensor(v.encode(text), dtype=torch.int64), block_size) for text in corpus())


def facts(**_) -> dict:
    """What a model is built for: the vocabulary's size and strings, character level."""
    v = vocab()
    return dict(vocab_size=len(v), itos=list(v.itos), level="char")


def unigram_bits_per_character() -> float:
    """The test split's cross-entropy, in bits per character, under the training split's character
    frequencies (add-one smoothed): what a model that ignores all context scores."""
    import math
    from collections import Counter

    train, test = corpus()
    counts, V = Counter(train), len(vocab())
    total = len(train) + V
    return -sum(math.log2((counts[c] + 1) / total) for c in test) / len(test)
