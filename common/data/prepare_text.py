"""Tokenize a corpus once into token shards for `--dataset tokens` (nanoGPT's prepare.py, for any text):

    python -m common.data.prepare_text --input FILE_OR_DIR --tokenizer {char,bpe,wordpiece} [--vocab-size N] --out DIR

--input is a UTF-8 file, a folder whose .txt files are read in sorted order of their paths, or
`pydoc` (the built-in corpus, with pydoc's own split). A file or folder is read as `--dataset text`
reads it: each file stripped of leading and trailing whitespace, the files joined by blank lines,
training text up to the first line break at or after 90% of the characters, test text after it
(the same split to the character: the first pass counts them). Both splits get the same ids as
`--dataset text` gives them, for char always, for bpe and wordpiece when the training sample is
the whole training text.

Memory stays flat in the size of the corpus: the files are read in chunks of CHUNK_BYTES, in two
passes. The first checks that they are UTF-8 text, counts characters and (char) collects the
characters the vocabulary holds; the second encodes and appends the ids to the shards.
    char  one id per character of the corpus, after <unk> (id 0), as text.CharVocab numbers them;
          encoded by a lookup table over code points.
    bpe   text.ByteBPE, trained on a bounded sample: the first --bpe-sample-mb MB (10**6 bytes of
          UTF-8) of the training text, cut at a paragraph; the text is then encoded in pieces cut
          before a single space or line break between two non-space characters, where GPT-2's
          pre-tokenizer splits anyway, so the pieces' ids are the whole text's (a text with no such
          place, one long line of CJK characters say, is held until its split ends).
    wordpiece  text.WordPiece, trained on the same sample and encoded in the same pieces (its
          pre-tokenizer splits at every space and line break too).
It writes DIR/train.bin, DIR/test.bin and DIR/meta.json (see common.data.tokens), under temporary
names until all three are complete. A mistake in the input is one line and exit code 2, with
nothing written.
"""

import argparse
import codecs
import json
import platform
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.data import text
from common.data.tokens import META, SPLITS, token_dtype
from common.errors import ConfigError

CHUNK_BYTES = 4 * 2**20  # read at a time
BPE_SAMPLE_MB = 10  # --bpe-sample-mb's default
BPE_PIECE = 2**16  # characters of text (at least) per piece the BPE encodes
BPE_BATCH = 8  # pieces it encodes at a time (HF tokenizers' threads share them)
CUT = re.compile(r"(?<=\S)(?=[ \n]\S)")  # where a text cuts without changing its BPE tokens
SEPARATOR = "\n\n"  # between files, as text joins them


@dataclass
class Kept:
    """What of a file the corpus keeps: its characters [start, end) (its text stripped), and the last
    line break in them (-1: none), as character offsets in the file."""

    path: Path
    start: int = -1
    end: int = 0
    last_line: int = -1


def chunks(path: Path):
    """A UTF-8 file's text in chunks of about CHUNK_BYTES, without reading it whole; ConfigError naming the
    file and the byte where it is not UTF-8 text (or holds a NUL byte: a binary file)."""
    decoder, at = codecs.getincrementaldecoder("utf-8")(), 0
    with open(path, "rb") as f:
        while data := f.read(CHUNK_BYTES):
            if (nul := data.find(b"\0")) >= 0:
                raise ConfigError(f"--input: {path} is not text: byte {at + nul:,} is NUL (a binary file?)")
            pending = decoder.getstate()[0]  # the bytes of a character the last chunk began
            try:
                yield decoder.decode(data)
            except UnicodeDecodeError as e:
                where, byte = at - len(pending) + e.start, (pending + data)[e.start]
                raise ConfigError(f"--input: {path} is not UTF-8 text: byte {where:,} (0x{byte:02x}) does not "
                                  f"decode") from None
            at += len(data)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise ConfigError(f"--input: {path} is not UTF-8 text: it ends inside a character") from None


def input_files(where: str) -> list[Path]:
    """The files --input names: the file itself, or a folder's *.txt files in sorted order of their paths."""
    root = Path(where)
    if not root.exists():
        raise ConfigError(f"--input {where} does not exist (a UTF-8 file, a folder of .txt files, or pydoc)")
    return text.txt_files(root, f"--input {where}")


def code_points(piece: str) -> np.ndarray:
    return np.frombuffer(piece.encode("utf-32-le"), np.uint32)


class FileCorpus:
    """Files read as `--dataset text` reads them, in two streaming passes: the first here (each file's
    bounds, the characters counted and, with `count_chars`, how often each code point occurs in the kept
    text), the second `pieces`.

    Args:
        where: --input, for meta.json.
    """

    def __init__(self, files: list[Path], count_chars: bool, where: str):
        self.counts = np.zeros(0x110000, np.int64) if count_chars else None
        self.kept = [self.survey(path) for path in files]
        if self.counts is not None:
            self.counts[ord("\n")] += len(SEPARATOR) * (len(files) - 1)
        self.total = sum(k.end - k.start for k in self.kept) + len(SEPARATOR) * (len(files) - 1)
        self.source = dict(input=str(Path(where).resolve()), files=len(files),
                           bytes=sum(p.stat().st_size for p in files))

    def survey(self, path: Path) -> Kept:
        """The first pass over one file. Leading whitespace is skipped; whitespace after the last
        non-space character so far is counted but held in `tail`, and taken off again if it ends the file."""
        kept, at, line_before, tail = Kept(path), 0, -1, Counter()
        for chunk in chunks(path):
            skip = 0
            if kept.start < 0:
                skip = len(chunk) - len(chunk.lstrip())
                kept.start = at + skip if skip < len(chunk) else -1
            body = chunk[skip:] if kept.start >= 0 else ""
            if length := len(body.rstrip()):  # the text reaches this far
                i = body.rfind("\n", 0, length)
                kept.last_line, kept.end = (at + skip + i if i >= 0 else line_before), at + skip + length
                tail = Counter()
            if self.counts is not None and body:
                found = np.bincount(code_points(body))
                self.counts[: len(found)] += found
                tail.update(body[length:])
            if (j := chunk.rfind("\n")) >= 0:
                line_before = at + j
            at += len(chunk)
        if kept.start < 0:
            raise ConfigError(f"--input: {path} is empty")
        for c, n in tail.items():  # counted, but stripped
            self.counts[ord(c)] -= n
        kept.last_line = kept.last_line if kept.last_line >= kept.start else -1
        return kept

    def characters(self) -> str:
        """Every character of the corpus, in order of code point."""
        return "".join(map(chr, np.flatnonzero(self.counts)))

    def text(self):
        """The corpus's text (files stripped, joined by blank lines) in chunks."""
        for n, kept in enumerate(self.kept):
            if n:
                yield SEPARATOR
            at = 0
            for chunk in chunks(kept.path):
                piece = chunk[max(0, kept.start - at) : max(0, kept.end - at)]
                at += len(chunk)
                if piece:
                    yield piece

    def has_line_after(self, position: int) -> bool:
        """Whether the corpus holds a line break at or after this character (the separators are two)."""
        at, last = 0, -1
        for n, kept in enumerate(self.kept):
            if n:
                last, at = at + 1, at + len(SEPARATOR)
            if kept.last_line >= 0:
                last = at + kept.last_line - kept.start
            at += kept.end - kept.start
        return last >= position

    def pieces(self):
        """(split, text) in order: "train" up to the first line break at or after TRAIN_FRACTION of the
        characters (at that fraction if none follows), then "test"."""
        threshold = int(text.TRAIN_FRACTION * self.total)
        return split_at(self.text(), threshold, self.has_line_after(threshold))


def split_at(texts, threshold: int, line: bool):
    """(split, text) pieces of a stream of texts: "train" up to the first line break at or after character
    `threshold` (with `line`; else up to the threshold), then "test"."""
    seen, split = 0, "train"
    for piece in texts:
        if split == "train" and seen + len(piece) > threshold:
            at = max(0, threshold - seen)
            cut = piece.find("\n", at) + 1 if line else at
            if cut > 0 or not line:
                if cut:
                    yield "train", piece[:cut]
                split, piece = "test", piece[cut:]
        seen += len(piece)
        if piece:
            yield split, piece


class PydocCorpus:
    """pydoc's topics, split as `--dataset pydoc` splits them (text.pydoc_corpus: small, read whole)."""

    def __init__(self):
        self.train, self.test = text.pydoc_corpus()
        self.total = len(self.train) + len(self.test)
        self.source = dict(input="pydoc", python=platform.python_version())

    def characters(self) -> str:
        return "".join(sorted(set(self.train) | set(self.test)))

    def pieces(self):
        for split, whole in (("train", self.train), ("test", self.test)):
            for i in range(0, len(whole), CHUNK_BYTES):
                yield split, whole[i : i + CHUNK_BYTES]


class CharEncoder:
    """Ids as text.CharVocab gives them, through a table indexed by code point."""

    def __init__(self, characters: str):
        self.vocab = text.CharVocab(characters)
        self.dtype = token_dtype(len(self.vocab))
        points = code_points(characters)
        self.table = np.zeros(int(points.max()) + 1, self.dtype)
        self.table[points] = np.arange(1, len(points) + 1)

    def encode(self, piece: str) -> np.ndarray:
        return self.table[code_points(piece)]

    def flush(self) -> np.ndarray:
        return np.zeros(0, self.dtype)


class BPEEncoder:
    """Ids of text.ByteBPE (or text.WordPiece), the text encoded in pieces of at least BPE_PIECE characters (many at a time,
    by HF tokenizers' threads), each cut where GPT-2's pre-tokenizer splits anyway (CUT)."""

    def __init__(self, bpe: text.ByteBPE | text.WordPiece):
        self.bpe, self.dtype, self.rest = bpe, token_dtype(len(bpe)), ""

    def encode(self, piece: str) -> np.ndarray:
        self.rest += piece
        pieces, begin = [], 0
        while len(self.rest) - begin > BPE_PIECE and (cut := CUT.search(self.rest, begin + BPE_PIECE)):
            pieces.append(self.rest[begin : cut.start()])
            begin = cut.start()
        self.rest = self.rest[begin:]
        return self.ids(pieces)

    def flush(self) -> np.ndarray:
        """The ids of what is held back: the end of a split."""
        ids, self.rest = self.ids([self.rest]), ""
        return ids

    def ids(self, pieces: list[str]) -> np.ndarray:
        """The pieces' ids, encoded BPE_BATCH pieces at a time (an Encoding holds a token's string, offsets
        and masks too: a few MB of text at once would take hundreds of MB)."""
        ids = [np.zeros(0, self.dtype)]
        for i in range(0, len(pieces), BPE_BATCH):
            encodings = self.bpe.tokenizer.encode_batch(pieces[i : i + BPE_BATCH])
            ids.append(np.array([t for e in encodings for t in e.ids], self.dtype))
        return np.concatenate(ids)


def bpe_sample(corpus, megabytes: float) -> str:
    """The first `megabytes` MB (10**6 bytes of UTF-8) of the training text, cut after a paragraph (or a
    line) when it is not the whole training text."""
    limit, held, size = int(megabytes * 10**6), [], 0
    for split, piece in corpus.pieces():
        if split != "train" or size > limit:
            break
        held.append(piece)
        size += len(piece.encode())
    sample = "".join(held)
    if size <= limit:
        return sample
    sample = sample.encode()[:limit].decode(errors="ignore")
    for end in ("\n\n", "\n"):
        if (cut := sample.rfind(end)) > 0:
            return sample[:cut]
    return sample


def write_shards(corpus, encoder, out: Path) -> dict:
    """Every split's ids appended to out/<split>.bin.partial; returns each split's tokens and characters."""
    counts = {split: dict(tokens=0, characters=0) for split in SPLITS}
    files = {split: open(out / f"{name}.partial", "wb") for split, name in SPLITS.items()}
    try:
        current = "train"
        for split, piece in corpus.pieces():
            if split != current:
                counts[current]["tokens"] += (ids := encoder.flush()).size
                ids.tofile(files[current])
                current = split
            counts[split]["tokens"] += (ids := encoder.encode(piece)).size
            counts[split]["characters"] += len(piece)
            ids.tofile(files[split])
        counts[current]["tokens"] += (ids := encoder.flush()).size
        ids.tofile(files[current])
    finally:
        for f in files.values():
            f.close()
    return counts


def check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    held = [name for name in (*SPLITS.values(), META) if (out / name).exists()]
    if held and not force:
        raise ConfigError(f"--out {out} already holds shards ({', '.join(held)}); choose a new folder, or add --force "
                          f"to replace them")


def prepare(where: str, tokenizer: str, out: Path, vocab_size: int | None = None,
            bpe_sample_mb: float | None = None, force: bool = False) -> list[str]:
    """Write out/train.bin, out/test.bin and out/meta.json for a corpus; returns the lines to print.
    ConfigError, before anything is written, for a mistake in the input."""
    if tokenizer not in text.TOKENIZERS:
        raise ConfigError(f"unknown tokenizer '{tokenizer}'; choose from: {', '.join(text.TOKENIZERS)}")
    if tokenizer == "char" and (vocab_size is not None or bpe_sample_mb is not None):
        raise ConfigError("--vocab-size and --bpe-sample-mb go with --tokenizer bpe or wordpiece; a char vocabulary "
                          "is the corpus's characters")
    if tokenizer == "bpe" and vocab_size is not None and vocab_size <= 256:
        raise ConfigError(f"--vocab-size {vocab_size}: a byte-level BPE holds the 256 bytes and its merges; use more "
                          f"than 256")
    if bpe_sample_mb is not None and bpe_sample_mb <= 0:
        raise ConfigError(f"--bpe-sample-mb must be a positive number, got {bpe_sample_mb}")
    check_out(out, force)
    corpus = PydocCorpus() if where == "pydoc" else FileCorpus(input_files(where), tokenizer == "char", where)
    if corpus.total < 2:
        raise ConfigError(f"--input {where} holds {corpus.total:,} characters, too few to split "
                          f"{text.TRAIN_FRACTION:.0%}/{1 - text.TRAIN_FRACTION:.0%} into training and test text")
    lines, meta = [], dict(level=tokenizer, source=corpus.source)
    if tokenizer == "char":
        encoder = CharEncoder(corpus.characters())
        decodes = encoder.vocab.facts()
    else:
        sample = bpe_sample(corpus, bpe_sample_mb or BPE_SAMPLE_MB)
        kind = text.ByteBPE if tokenizer == "bpe" else text.WordPiece
        encoder = BPEEncoder(kind.train(sample, vocab_size or text.BPE_VOCAB_SIZE))
        decodes = encoder.bpe.facts()
        meta |= dict(bpe_sample_mb=bpe_sample_mb or BPE_SAMPLE_MB, bpe_sample_characters=len(sample))
        lines.append(f"{tokenizer}: {len(encoder.bpe):,} tokens, trained on the first {len(sample):,} characters of the "
                     f"training text (at most {bpe_sample_mb or BPE_SAMPLE_MB:g} MB)")
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        counts = write_shards(corpus, encoder, out)
        for split, c in counts.items():
            c["characters_per_token"] = round(c["characters"] / max(1, c["tokens"]), 4)
        meta = dict(level=tokenizer, vocab_size=decodes["vocab_size"], dtype=encoder.dtype, splits=counts) | meta
        meta |= {k: v for k, v in decodes.items() if k not in ("vocab_size", "level")}
        (out / f"{META}.partial").write_text(json.dumps(meta))
        for name in (*SPLITS.values(), META):  # the shards first: a meta.json is the mark of a complete folder
            (out / f"{name}.partial").replace(out / name)
    except BaseException:
        for name in (*SPLITS.values(), META):
            (out / f"{name}.partial").unlink(missing_ok=True)
        if made:
            out.rmdir()
        raise
    for split, c in counts.items():
        path = out / SPLITS[split]
        lines.append(f"{split}: {c['characters']:,} characters -> {c['tokens']:,} tokens "
                     f"({c['characters_per_token']:.2f} characters a token), {path} ({encoder.dtype}, "
                     f"{path.stat().st_size / 1e6:,.1f} MB)")
    return lines


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line and exit code 2 (train.py's rule), with no usage block."""

    def error(self, message: str):
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m common.data.prepare_text", allow_abbrev=False,
                description="Tokenize a corpus once into token shards (train.bin, test.bin, meta.json) for "
                            "train.py --dataset tokens --data-dir OUT.")
    p.add_argument("--input", required=True, help="a UTF-8 text file, a folder of .txt files (read in sorted order "
                   "of their paths), or pydoc (the built-in corpus, with its own split)")
    p.add_argument("--tokenizer", choices=text.TOKENIZERS, default="char",
                   help="char (default): the corpus's characters; bpe: a byte-level BPE trained on a sample; "
                        "wordpiece: BERT's WordPiece, trained so")
    p.add_argument("--vocab-size", type=int, help=f"--tokenizer bpe or wordpiece: its vocabulary (default "
                                                  f"{text.BPE_VOCAB_SIZE})")
    p.add_argument("--bpe-sample-mb", type=float, metavar="MB", help=f"--tokenizer bpe or wordpiece: train it on the "
                   f"first MB "
                   f"megabytes of the training text (default {BPE_SAMPLE_MB})")
    p.add_argument("--out", required=True, type=Path, help="the folder to write the shards into")
    p.add_argument("--force", action="store_true", help="replace the shards that --out already holds")
    return p


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    try:
        args = build_parser().parse_args(argv)
        lines = prepare(args.input, args.tokenizer, args.out, args.vocab_size, args.bpe_sample_mb, args.force)
    except ConfigError as e:
        print(f"prepare_text: error: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    print(f"prepared in {time.perf_counter() - start:.0f} s; train with: python train.py --paper gpt --dataset tokens "
          f"--data-dir {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
