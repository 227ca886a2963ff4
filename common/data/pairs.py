"""Sentence pairs to translate, read from --data-dir: one pair a line, word by word.

The file is the Tatoeba / Anki format (manythings.org's fra-eng.zip holds fra.txt):

    Go.<TAB>Va !<TAB>CC-BY 2.0 (France) Attribution: tatoeba.org ...
    I ran.<TAB>J'ai couru.<TAB>...

the source, a tab, the target; further tab-separated columns (Anki's attribution) are ignored.
--data-dir names the file (its name ending in .txt or .tsv), or a folder holding exactly one such
file; files whose name starts with "_" or "." (the zip's _about.txt, hidden files) are not counted.
The file must be UTF-8 (a byte-order mark is allowed, and \\r\\n line ends), every line a pair: an
empty line, a line with no tab, an empty source or target, or bytes that are not UTF-8 are one
error naming the file and the line.

Word level: text is lowercased and split into words and single punctuation marks ("I ran." ->
"i", "ran", "."; "J'ai" -> "j", "'", "ai"). A fixed-seed shuffle of the line indices puts 10% of
the pairs (at least one) in the test split and the rest in training, the same every time for the
same file. The source and target vocabularies are built from the training split only: the words
seen at least MIN_FREQ times, most frequent first (ties alphabetical), after the four specials
<pad> 0, <s> 1 (the decoder's first input), </s> 2 (the end of every target), <unk> 3 (a word not in
the vocabulary: rare, only in the test split, or typed by a user).
"""

import random
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch.utils.data import Dataset

from common.errors import ConfigError

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
PAD, BOS, EOS, UNK = range(4)
MIN_FREQ = 2  # a word seen fewer times in the training split is <unk>
SPLIT_SEED, TEST_FRACTION = 0, 0.1
SUFFIXES = (".txt", ".tsv")
FORMAT = "one pair a line, source<TAB>target, in a .txt or .tsv file (or a folder holding one)"
WORD = re.compile(r"\w+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Lowercased words and single punctuation marks: "Go." -> ["go", "."]."""
    return WORD.findall(text.lower())


class Vocab:
    """Words <-> ids: the four specials, then `words` in order."""

    def __init__(self, words: list[str]):
        self.itos = [*SPECIALS, *words]
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    @classmethod
    def build(cls, sentences: list[list[str]], min_freq: int = MIN_FREQ) -> "Vocab":
        """The words of tokenized sentences seen at least min_freq times, most frequent first, ties
        alphabetical."""
        counts = Counter(w for words in sentences for w in words)
        return cls(sorted((w for w, n in counts.items() if n >= min_freq), key=lambda w: (-counts[w], w)))

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        """Ids of the text's words; <unk> for a word the vocabulary does not hold."""
        return self.ids(tokenize(text))

    def ids(self, words: list[str]) -> list[int]:
        """Ids of words already tokenized."""
        return [self.stoi.get(w, UNK) for w in words]

    def decode(self, ids) -> str:
        """The words of ids up to the first </s>, joined by spaces, specials left out."""
        out = []
        for i in (int(i) for i in ids):
            if i == EOS:
                break
            if i >= len(SPECIALS):
                out.append(self.itos[i])
        return " ".join(out)


class Pairs(Dataset):
    """(source ids (S,), target ids (T,) ending with </s>) pairs; `sizes` holds each source's length
    for bucketing, `texts` the (source, target) strings and `lines` their line numbers in the file."""

    def __init__(self, texts: list[tuple[str, str]], lines: list[int], sources: list[list[int]],
                 targets: list[list[int]]):
        self.texts, self.lines = texts, lines
        self.sources = [torch.tensor(s, dtype=torch.int64) for s in sources]
        self.targets = [torch.tensor(t + [EOS], dtype=torch.int64) for t in targets]
        self.sizes = [len(s) for s in self.sources]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sources[i], self.targets[i]


@dataclass(frozen=True, eq=False)  # hashed by identity, for the cache of its datasets
class Corpus:
    """A parsed file: its pairs with their line numbers and words, the split, and the vocabularies."""

    path: Path
    texts: list[tuple[str, str]]
    lines: list[int]
    words: list[tuple[list[str], list[str]]]  # each pair's tokenized source and target
    train: list[int]  # indices into texts, in file order
    test: list[int]
    src: Vocab
    tgt: Vocab


def find_file(data_dir: str | None) -> Path:
    """The pairs file that --data-dir names, or the one .txt / .tsv file of the folder it names."""
    if not data_dir:
        raise ConfigError(f"--dataset pairs reads sentence pairs from --data-dir PATH: {FORMAT}")
    path = Path(data_dir)
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES and p.is_file()
                       and not p.name.startswith(("_", ".")))
        if len(found) != 1:
            names = ", ".join(p.name for p in found) or "none"
            raise ConfigError(f"--dataset pairs: {path} should hold exactly one .txt or .tsv file of sentence pairs; "
                              f"found {names}")
        return found[0]
    if not path.exists():
        raise ConfigError(f"--dataset pairs: {path} does not exist; --data-dir needs {FORMAT}")
    if path.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"--dataset pairs: {path} is not a .txt or .tsv file; --data-dir needs {FORMAT}")
    return path


def parse(path: Path) -> tuple[list[tuple[str, str]], list[int]]:
    """The (source, target) pairs of a file and their line numbers (from 1), checked line by line."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"--dataset pairs: cannot read {path} ({e.strerror or type(e).__name__})") from None
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark is no part of line 1
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"--dataset pairs: {path}: line {line} is not UTF-8 text ({e.reason}: byte "
                          f"0x{data[e.start]:02x}); save the file as UTF-8") from None
    rows = text.split("\n")
    if rows[-1] == "":  # the newline that ends the last line
        rows.pop()
    if not rows:
        raise ConfigError(f"--dataset pairs: {path} is empty; it needs {FORMAT}")
    texts, lines = [], []
    for n, row in enumerate(rows, start=1):
        row = row.removesuffix("\r")
        where = f"--dataset pairs: {path}: line {n}"
        if not row.strip():
            raise ConfigError(f"{where} is empty; every line must be a pair, source<TAB>target")
        if "\t" not in row:
            raise ConfigError(f"{where} has no tab: {_clip(row)!r}; every line must be source<TAB>target")
        source, target = (column.strip() for column in row.split("\t")[:2])
        if not source or not target:
            raise ConfigError(f"{where} has an empty {'source' if not source else 'target'}: {_clip(row)!r}")
        texts.append((source, target))
        lines.append(n)
    if len(texts) < 2:
        raise ConfigError(f"--dataset pairs: {path} holds 1 pair; it needs at least 2 (one for the test split)")
    return texts, lines


def _clip(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[:width] + "..."


def split(n: int) -> tuple[list[int], list[int]]:
    """(train, test) indices of n pairs: TEST_FRACTION of them (at least one) drawn by a fixed-seed
    shuffle for the test split, each split in file order."""
    order = list(range(n))
    random.Random(SPLIT_SEED).shuffle(order)
    n_test = max(1, round(n * TEST_FRACTION))
    return sorted(order[n_test:]), sorted(order[:n_test])


@lru_cache(maxsize=8)
def _corpus(path: str, mtime_ns: int, size: int) -> Corpus:
    texts, lines = parse(Path(path))
    return build_corpus(Path(path), texts, lines, *split(len(texts)))


def build_corpus(path: Path, texts: list[tuple[str, str]], lines: list[int], train: list[int],
                 test: list[int]) -> Corpus:
    """The corpus of pairs already read and split: their words, and the vocabularies of the training split."""
    words = [(tokenize(s), tokenize(t)) for s, t in texts]
    src = Vocab.build([words[i][0] for i in train])
    tgt = Vocab.build([words[i][1] for i in train])
    return Corpus(path, texts, lines, words, train, test, src, tgt)


def corpus(data_dir: str | None) -> Corpus:
    """The parsed file of --data-dir, read once per version of the file (its path, time and size)."""
    path = find_file(data_dir).resolve()
    stat = path.stat()
    return _corpus(str(path), stat.st_mtime_ns, stat.st_size)


def vocabularies(data_dir: str | None) -> tuple[Vocab, Vocab]:
    """The (source, target) vocabularies of the training split."""
    c = corpus(data_dir)
    return c.src, c.tgt


def encode_source(text: str, data_dir: str | None) -> list[int]:
    """The source ids of a typed sentence, as the model trained on data_dir reads it (no </s>, as in
    the data set's sources)."""
    return corpus(data_dir).src.encode(text)


@lru_cache(maxsize=8)
def datasets_of(c: Corpus) -> tuple[Pairs, Pairs]:
    """The training and test pairs of a corpus (made once per corpus)."""
    def subset(indices: list[int]) -> Pairs:
        return Pairs([c.texts[i] for i in indices], [c.lines[i] for i in indices],
                     [c.src.ids(c.words[i][0]) for i in indices], [c.tgt.ids(c.words[i][1]) for i in indices])

    return subset(c.train), subset(c.test)


def load(data_dir: str | None = None, **_) -> tuple[Pairs, Pairs]:
    """The training and test pairs of the file."""
    return datasets_of(corpus(data_dir))


def facts(data_dir: str | None = None, **_) -> dict:
    """What a model is built for (see `facts_of`)."""
    return facts_of(corpus(data_dir))


def facts_of(c: Corpus) -> dict:
    """What a model is built for: the sizes of the source and target vocabularies, the padding, start
    and end ids, the target words (itos, for reading outputs) and the source words and their ids
    (src_itos, src_stoi, for encoding typed text)."""
    return dict(src_vocab=len(c.src), tgt_vocab=len(c.tgt), pad_id=PAD, bos_id=BOS, eos_id=EOS, itos=list(c.tgt.itos),
                src_itos=list(c.src.itos), src_stoi=dict(c.src.stoi), level="word")
