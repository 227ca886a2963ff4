"""Text to model: the built-in `pydoc` corpus, or `text` from --data-dir, tokenized by character,
by byte-level BPE or by WordPiece, cut into blocks for a language model.

`pydoc` is real English that the Python standard library ships: the documentation topics of
`pydoc_data.topics` (the text `help("if")` prints; about 465,000 characters over 79 topics in
Python 3.11), read at run time and never copied into the repository. Its split is fixed and by
topic: the topics in sorted order, the first ones (about TRAIN_FRACTION of the characters) for
training and the rest for test, each split's topics joined by blank lines. (Some topics repeat a
paragraph of another, so a few test paragraphs also stand in the training text.)

`pydoc-topics` is the same text labelled, for classification (GPT's fine-tuning on a small labelled
task): passages of 128 tokens of eight topics (TOPIC_CLASSES), each labelled by its topic, balanced:
48 a topic for training (384) and 32 for test (256), from the start and the end of the topic's text,
in pydoc's tokens (see `topics_load`). Against pre-training: the eight topics all lie in pydoc's
training split, none in its test split, so a model pre-trained on `pydoc` has read every passage here,
training and test, as unlabelled text, never its label. Unlabelled text of the task's domain is GPT's
setting; that the test passages are in it too is not (BooksCorpus held none of the tasks' test
sets): pydoc's split is fixed and by whole topics, so `pydoc-rest` holds them out.

`pydoc-rest` is pydoc without the eight topics: its training text is pydoc's training topics but
REST_HELD_OUT (the eight, and the two that repeat their text: about 203,000 characters), its test text
pydoc's; its tokenizer is pydoc's (the same ids,
so that a model pre-trained on it fine-tunes on pydoc-topics; with --tokenizer bpe, merges learnt on
pydoc's whole training text, the eight topics' included). A model pre-trained on it has read no
passage of pydoc-topics, neither its training nor its test ones.

`text` reads --data-dir: one UTF-8 text file, or a folder whose *.txt files (at any depth, in
sorted order of their paths) are joined by blank lines. Its split is fixed too: training text up to
the first line break after TRAIN_FRACTION of the characters, test text after it. An empty file, a
file that is not UTF-8 text (bytes that do not decode, or a NUL byte: a binary file), or a folder
without .txt files is one ConfigError naming it.

Tokenizers (--tokenizer):
    char  one id per character of the corpus (both splits, as the dates' alphabet), after <unk>
          (id 0), which a typed prompt's unknown characters become.
    bpe   byte-level BPE (GPT-2's; HF tokenizers) trained on the training split to --vocab-size
          tokens: the 256 bytes, then merges. Any text encodes, whatever characters it holds.
          The trainer saves it as tokenizer.json in the run directory.
    wordpiece  BERT's WordPiece (HF tokenizers), uncased, trained on the training split to --vocab-size
          tokens, [PAD] [UNK] [CLS] [SEP] [MASK] first; saved as tokenizer.json too. Its text is
          normalised (lowercased, accents stripped) and a word holding a character it never saw is
          [UNK] whole; bits per character count the characters of the normalised words a token stands
          for, not the spaces between words, so they read higher than char's or bpe's on the same text.
A sample is a block of `block_size` tokens and the same block shifted by one (the next token at
every position); the blocks of a split do not overlap. Bits per character count the characters
a token stands for (`token_chars`; at character level one each), so tokenizers compare.
"""

from functools import lru_cache
from pathlib import Path

import torch
from torch.utils.data import Dataset, TensorDataset

from common.errors import ConfigError

BLOCK_SIZE = 128  # tokens a sample reads
TRAIN_FRACTION = 0.9  # of the characters
UNK = 0
from common.choices import BPE_VOCAB_SIZE, TOKENIZERS


@lru_cache(maxsize=1)
def pydoc_split() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of pydoc's (training topics, test topics): in sorted order, the first ones (about
    TRAIN_FRACTION of the characters) for training."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    total, seen, split = sum(len(topics[n].strip()) for n in names), 0, len(names)
    for i, name in enumerate(names):
        if seen >= TRAIN_FRACTION * total:
            split = i
            break
        seen += len(topics[name].strip())
    return tuple(names[:split]), tuple(names[split:])


def _joined(names) -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name].strip() for name in names)


@lru_cache(maxsize=1)
def pydoc_corpus() -> tuple[str, str]:
    """(training text, test text) of the pydoc topics: whole topics, split by name."""
    train, test = pydoc_split()
    return _joined(train), _joined(test)


@lru_cache(maxsize=1)
def pydoc_rest_corpus() -> tuple[str, str]:
    """pydoc-rest's (training text, test text): pydoc's training topics but REST_HELD_OUT, and pydoc's
    test text."""
    train, test = pydoc_split()
    return _joined(n for n in train if n not in REST_HELD_OUT), _joined(test)


def text_files(data_dir: str | None) -> list[Path]:
    """The files `text` reads from --data-dir: the file itself, or a folder's *.txt files in sorted order."""
    if not data_dir:
        raise ConfigError("--dataset text reads --data-dir: a UTF-8 text file, or a folder of .txt files")
    root = Path(data_dir)
    if not root.exists():
        raise ConfigError(f"--dataset text: {root} does not exist")
    return txt_files(root, f"--dataset text: {root}")


def txt_files(root: Path, named: str) -> list[Path]:
    """root itself if a file, else its *.txt files at any depth in sorted order of their paths; a
    ConfigError "`named` holds no .txt file" where there are none."""
    if root.is_file():
        return [root]
    files = sorted(p for p in root.rglob("*.txt") if p.is_file())
    if not files:
        raise ConfigError(f"{named} holds no .txt file")
    return files


def read_text(path: Path) -> str:
    """A file's text; ConfigError (naming it) when it is empty or not UTF-8 text."""
    data = path.read_bytes()
    if b"\0" in data:
        raise ConfigError(f"--dataset text: {path} is not text: it holds NUL bytes (a binary file?)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"--dataset text: {path} is not UTF-8 text: byte {e.start} "
                          f"(0x{data[e.start]:02x}) does not decode") from None
    if not text.strip():
        raise ConfigError(f"--dataset text: {path} is empty")
    return text.strip()


@lru_cache(maxsize=4)
def _folder_corpus(files: tuple[tuple[str, int, int], ...], where: str) -> tuple[str, str]:
    text = "\n\n".join(read_text(Path(name)) for name, _, _ in files)
    cut = text.find("\n", int(TRAIN_FRACTION * len(text)))
    cut = cut + 1 if cut >= 0 else int(TRAIN_FRACTION * len(text))
    train, test = text[:cut], text[cut:]
    if not train.strip() or not test.strip():
        raise ConfigError(f"--dataset text: {where} holds {len(text):,} characters, too few to split "
                          f"{TRAIN_FRACTION:.0%}/{1 - TRAIN_FRACTION:.0%} into training and test text")
    return train, test


def corpus(data_dir: str | None = None, dataset: str = "pydoc") -> tuple[str, str]:
    """(training text, test text) of a data set: pydoc's topics (all, or the rest), or text's files
    (read again when one changes: the cache is keyed by their names, sizes and times)."""
    if dataset == "pydoc":
        return pydoc_corpus()
    if dataset == "pydoc-rest":
        return pydoc_rest_corpus()
    stats = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in text_files(data_dir))
    return _folder_corpus(stats, str(data_dir))


class CharVocab:
    """Characters <-> ids: <unk> 0, then `chars` in order."""

    level = "char"

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

    def facts(self) -> dict:
        return dict(vocab_size=len(self), itos=list(self.itos), level=self.level)


def _byte_of_symbol() -> dict[str, int]:
    """GPT-2's byte-level alphabet: which byte each of its 256 printable symbols stands for (bytes that
    print as themselves keep their code point; the others take 256, 257, ... in byte order)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {chr(b): b for b in kept} | {chr(256 + i): b for i, b in enumerate(moved)}


class _HFTokenizer:
    """A tokenizers.Tokenizer, and what every tokenizer of ours built on one does alike: rebuilt from its
    JSON (`from_str`, as a run's data facts keep it) and its vocabulary's size."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def from_str(cls, json: str):
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_str(json))

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()


class ByteBPE(_HFTokenizer):
    """Byte-level BPE (Radford et al. 2019, Section 2.2) with HF tokenizers: GPT-2's pre-tokenizer (its
    regular expression over the bytes shown as 256 printable symbols) and byte-level decoding.

    Args:
        tokenizer: a tokenizers.Tokenizer (see `train`, `from_str`).
    """

    level = "bpe"

    @classmethod
    def train(cls, text: str, vocab_size: int = BPE_VOCAB_SIZE) -> "ByteBPE":
        """Merges learnt from `text` (its paragraphs one sequence each) until `vocab_size` tokens."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train_from_iterator(text.split("\n\n"), trainer)
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def token_chars(self) -> list[int]:
        """Per id, the characters it stands for: its bytes that start a UTF-8 character (a character
        split over tokens counts once, in the token holding its first byte), so that a text's tokens
        sum to its characters."""
        byte = _byte_of_symbol()
        vocab = self.tokenizer.get_vocab()
        chars = [0] * len(self)
        for symbols, i in vocab.items():
            chars[i] = sum(1 for s in symbols if byte[s] & 0xC0 != 0x80)
        return chars

    def facts(self) -> dict:
        return dict(vocab_size=len(self), level=self.level, token_chars=self.token_chars(),
                    tokenizer=self.tokenizer.to_str())


_PLANE_15 = 0xF0000  # the first supplementary private-use plane (15, then 16, up to U+10FFFF)


def _inside(c: str) -> str:
    """A character inside a word (WordPiece's "##c") as one character for BPE: U+0000..U+1FFFF moved to
    planes 15 and 16."""
    return chr(_PLANE_15 + ord(c))


def _written(piece: str) -> str:
    """A piece BPE learnt from words marked by `_inside`, as WordPiece writes it: "##" and the characters
    back where it starts inside a word."""
    plain = "".join(chr(ord(c) - _PLANE_15) if ord(c) >= _PLANE_15 else c for c in piece)
    return "##" + plain if ord(piece[0]) >= _PLANE_15 else plain


class WordPiece(_HFTokenizer):
    """WordPiece (Devlin et al. 2019, Section 3.1: "We use WordPiece embeddings (Wu et al., 2016) with a
    30,000 token vocabulary") with HF tokenizers: BERT's normaliser and pre-tokenizer (words split at
    whitespace and around every punctuation character), then each word greedily into the longest pieces
    of the vocabulary, "##" marking a piece inside a word. A word holding a character the vocabulary lacks
    becomes [UNK] whole, as the released tokenization.py does.

    Uncased by default, as BERT-base and BERT-large uncased, the models of the paper's GLUE and SQuAD
    tables: the text is lowercased and its accents stripped before it is split, so that "The" and "the"
    share a piece and a small vocabulary goes further. lowercase=False is the released cased models'
    (accents and case kept), which the released README advises where case carries the label (NER).

    The special tokens take the first ids, in this order: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4
    (the released vocabulary has [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103: ours are not
    its ids). `encode` adds none of them: the data set builds "[CLS] A [SEP] B [SEP]" itself.

    Args:
        tokenizer: a tokenizers.Tokenizer (see `train`, `from_str`).
    """

    level = "wordpiece"
    SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (tokenizer.token_to_id(t)
                                                                            for t in self.SPECIALS)

    @classmethod
    def train(cls, text: str, vocab_size: int = BPE_VOCAB_SIZE, lowercase: bool = True) -> "WordPiece":
        """Pieces learnt from `text` until `vocab_size` tokens, the five specials and every character of the
        text included (fewer where the text holds fewer words).

        HF's WordPieceTrainer is BPE over the words with "##" before every character but a word's first:
        the most frequent pair merged first, ties to the pair of smaller ids. It numbers the "##"
        characters in the order of a hash map, which changes from run to run, and so do the ties and the
        vocabulary (seen: two to four vocabularies in four runs). Here BPE learns the same merges from the
        words with each character but the first written as a private-use character (plane 15 or 16, see
        `_inside`), so that the alphabet is numbered by code point, as ByteBPE's; the pieces are then
        written back with "##". The same text gives the same vocabulary in every process, as each rank
        of a launch trains its own. A word holding a character that cannot be so written (above U+1FFFF
        inside a word, or one of the private-use planes) is left out of training.
        """
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)  # strip_accents follows lowercase
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # words joined by one space, exactly

        words = (w for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text)))
        marked = [w[0] + "".join(map(_inside, w[1:])) for w in words  # "word" -> "w" + "ord" moved
                  if ord(w[0]) < _PLANE_15 and all(ord(c) < 0x20000 for c in w[1:])]
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        bpe.train_from_iterator([" ".join(marked)], trainers.BpeTrainer(
            vocab_size=vocab_size - len(cls.SPECIALS), show_progress=False))
        pieces = sorted(bpe.get_vocab().items(), key=lambda kv: kv[1])  # alphabet by code point, then merges
        vocab = {t: i for i, t in enumerate(cls.SPECIALS)}
        for piece, _ in pieces:
            vocab[_written(piece)] = len(vocab)
        tok.model = models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##")
        tok.add_special_tokens(list(cls.SPECIALS))  # "[MASK]" in a text is the mask, never split
        return cls(tok)

    def special_ids(self) -> list[int]:
        """The ids of [PAD], [UNK], [CLS], [SEP] and [MASK]: those masking never chooses nor draws."""
        return [self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id]

    def encode(self, text: str) -> list[int]:
        """The pieces' ids, no [CLS] or [SEP] added."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """The normalised words joined by single spaces, pieces inside a word joined; special tokens kept
        (a masked input reads "[MASK]")."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_chars(self) -> list[int]:
        """Per id, the characters of the normalised text it stands for: a piece's own ("##" not counted),
        one for [UNK] (a word it could not read, of unknown length), none for the other specials; the
        spaces between words count in no token."""
        chars = [0] * len(self)
        for piece, i in self.tokenizer.get_vocab().items():
            chars[i] = 1 if i == self.unk_id else 0 if piece in self.SPECIALS else len(piece.removeprefix("##"))
        return chars

    def facts(self) -> dict:
        return dict(vocab_size=len(self), level=self.level, tokenizer=self.tokenizer.to_str(),
                    token_chars=self.token_chars(), pad_id=self.pad_id, unk_id=self.unk_id, cls_id=self.cls_id,
                    sep_id=self.sep_id, mask_id=self.mask_id)


Tokenizer = CharVocab | ByteBPE | WordPiece


@lru_cache(maxsize=4)
def _tokenizer(train: str, test: str, kind: str, vocab_size: int | None) -> Tokenizer:
    if kind == "char":
        return CharVocab("".join(sorted(set(train) | set(test))))
    if kind == "bpe":
        return ByteBPE.train(train, vocab_size or BPE_VOCAB_SIZE)
    if kind == "wordpiece":
        return WordPiece.train(train, vocab_size or BPE_VOCAB_SIZE)
    raise ConfigError(f"unknown tokenizer '{kind}'; choose from: {', '.join(TOKENIZERS)}")


def make_tokenizer(data_dir: str | None = None, tokenizer: str = "char", vocab_size: int | None = None,
                   dataset: str = "pydoc") -> Tokenizer:
    """The data set's tokenizer: its characters, or a BPE or WordPiece trained on its training split (pydoc-rest's:
    pydoc's, so that its ids are pydoc-topics')."""
    return tokenizer_of(corpus(data_dir, "pydoc" if dataset == "pydoc-rest" else dataset), tokenizer, vocab_size)


def tokenizer_of(texts: tuple[str, str], tokenizer: str = "char", vocab_size: int | None = None) -> Tokenizer:
    """The tokenizer of a (training text, test text) corpus: the characters of both, or a BPE or WordPiece
    trained on the training text (one per corpus and kind: cached)."""
    return _tokenizer(*texts, tokenizer, vocab_size)


def codec(facts: dict) -> Tokenizer:
    """The tokenizer a data set's facts describe (what common.generate encodes a prompt with)."""
    if facts.get("level") in ("bpe", "wordpiece"):
        return (ByteBPE if facts["level"] == "bpe" else WordPiece).from_str(facts["tokenizer"])
    return CharVocab("".join(facts["itos"][1:]))


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


def load(data_dir: str | None = None, block_size: int | None = None, tokenizer: str = "char",
         vocab_size: int | None = None, dataset: str = "pydoc", **_) -> tuple[Blocks, Blocks]:
    """The training and test blocks of a data set's text."""
    where = dataset if dataset.startswith("pydoc") else data_dir
    return blocks_of(corpus(data_dir, dataset), make_tokenizer(data_dir, tokenizer, vocab_size, dataset),
                     block_size, dataset, (where, where))


def blocks_of(texts: tuple[str, str], tok: Tokenizer, block_size: int | None, dataset: str,
              wheres: tuple[str, str]) -> tuple[Blocks, Blocks]:
    """The training and test blocks of a (training text, test text) corpus; a text shorter than one block
    is a ConfigError naming the data set and where the text came from (`wheres`, one per split)."""
    block_size, blocks = block_size or BLOCK_SIZE, []
    for split, text, where in zip(("training", "test"), texts, wheres):
        ids = torch.tensor(tok.encode(text), dtype=torch.int64)
        if len(ids) < block_size + 1:
            raise ConfigError(f"--dataset {dataset}: the {split} text of {where} is {len(ids):,} tokens, fewer than "
                              f"one block of {block_size} + 1; use a smaller --block-size or more text")
        blocks.append(Blocks(ids, block_size))
    return tuple(blocks)


def facts(data_dir: str | None = None, tokenizer: str = "char", vocab_size: int | None = None,
          dataset: str = "pydoc", **_) -> dict:
    """What a model is built for: the vocabulary's size, and what decodes its ids (char: the
    strings; bpe: the tokenizer's JSON and each token's characters)."""
    return make_tokenizer(data_dir, tokenizer, vocab_size, dataset).facts()


# ---------------------------------------------------------------- pydoc-topics: passages labelled by topic

# Eight topics of pydoc's training split, each over 11,000 characters, none sharing a passage with another of
# them or with the test split: compound repeats while's and with's, which are test topics, so it is not one;
# specialnames holds customization and attribute-access, which are. A label is the topic's index here.
TOPIC_CLASSES = ("assignment", "attribute-access", "customization", "debugger", "formatstrings", "string-methods",
                 "types", "typesmapping")
# pydoc-rest leaves out the eight and the training topics that share a passage of 128 characters with them:
# augassign repeats assignment's, specialnames customization's and attribute-access' (tests check no other does).
REST_HELD_OUT = TOPIC_CLASSES + ("augassign", "specialnames")
TOPIC_TRAIN, TOPIC_TEST = 48, 32  # passages of each topic: its first ones for training, its last ones for test


def topics_load(block_size: int | None = None, tokenizer: str = "char", vocab_size: int | None = None,
                **_) -> tuple[TensorDataset, TensorDataset]:
    """pydoc-topics' (training, test) passages: sample k is (ids (T,), the topic's class id).

    Each topic's text is encoded with pydoc's tokenizer (`make_tokenizer`: the one --dataset pydoc
    pre-trains with, so that a pre-trained model's vocabulary fits) and cut into non-overlapping passages
    of block_size tokens (128); the first TOPIC_TRAIN of a topic are for training and its last TOPIC_TEST
    for test, disjoint parts of its text (a longer topic's middle goes unused). A topic of fewer passages
    (at a longer --block-size, or BPE's fewer tokens) is a ConfigError naming it. In WordPiece tokens a
    passage is BERT's single-segment input, "[CLS] text [SEP]" (Section 3, Figure 1): block_size - 2 tokens
    of text between the two.
    """
    from pydoc_data.topics import topics

    block_size, tok = block_size or BLOCK_SIZE, make_tokenizer(tokenizer=tokenizer, vocab_size=vocab_size)
    wrap = isinstance(tok, WordPiece)
    length = block_size - 2 if wrap else block_size  # the text's tokens in a passage
    splits = ([], []), ([], [])  # (passages, labels) of training and of test
    for label, name in enumerate(TOPIC_CLASSES):
        ids = torch.tensor(tok.encode(topics[name].strip()), dtype=torch.int64)
        n = len(ids) // length
        if n < TOPIC_TRAIN + TOPIC_TEST:
            raise ConfigError(f"--dataset pydoc-topics: topic {name} holds {n} passages of {block_size} tokens, fewer "
                              f"than the {TOPIC_TRAIN} + {TOPIC_TEST} a class needs; use a smaller --block-size")
        passages = ids[: n * length].view(n, length)  # (n, T) or (n, T - 2)
        if wrap:  # (n, T): [CLS] passage [SEP]
            passages = torch.cat([torch.full((n, 1), tok.cls_id), passages, torch.full((n, 1), tok.sep_id)], dim=1)
        for (x, y), part in zip(splits, (passages[:TOPIC_TRAIN], passages[n - TOPIC_TEST:])):
            x.append(part)
            y.append(torch.full((len(part),), label, dtype=torch.int64))
    return tuple(TensorDataset(torch.cat(x), torch.cat(y)) for x, y in splits)


def topics_facts(tokenizer: str = "char", vocab_size: int | None = None, **_) -> dict:
    """pydoc's tokenizer's facts (vocab_size, and what decodes ids), the classes and their names."""
    return make_tokenizer(tokenizer=tokenizer, vocab_size=vocab_size).facts() | dict(
        num_classes=len(TOPIC_CLASSES), classes=list(TOPIC_CLASSES))


def unigram_bits_per_character() -> float:
    """pydoc's test split's cross-entropy, in bits per character, under the training split's character
    frequencies (add-one smoothed): what a model that ignores all context scores."""
    import math
    from collections import Counter

    train, test = pydoc_corpus()
    counts, V = Counter(train), len(make_tokenizer())
    total = len(train) + V
    return -sum(math.log2((counts[c] + 1) / total) for c in test) / len(test)
