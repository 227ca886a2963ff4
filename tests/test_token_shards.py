"""Token shards: `python -m common.data.prepare_text` and `--dataset tokens` (corpora beyond memory)."""

import json
import shutil
import tracemalloc

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from common.data import get_dataset, prepare_text, text, tokens, train_loader
from common.data.samplers import ChunkedOrder, ResumableSampler
from tests.conftest import bitwise_equal, interrupted_copy, load_json, refused, tree_snapshot, weights
from train import main as train

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

ODD = "naïve café: ☃ 雪 — \u0301e\n\ttabs and emoji 🐍"  # characters of 1 to 4 UTF-8 bytes, and a lone accent


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One torch thread, as under xdist: the runs here are small, and a second thread mostly waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def prepare(capsys, *args) -> tuple[int, list[str], list[str]]:
    """prepare_text's exit code and its printed lines (stdout, stderr)."""
    capsys.readouterr()
    code = prepare_text.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out.strip().splitlines(), err.strip().splitlines()


@pytest.fixture(scope="module")
def pydoc_shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards") / "pydoc"
    assert prepare_text.main(["--input", "pydoc", "--tokenizer", "char", "--out", str(folder)]) == 0
    return folder


def ids_of(folder, split: str) -> np.ndarray:
    meta = load_json(folder / "meta.json")
    return np.fromfile(folder / f"{split}.bin", meta["dtype"])


def test_pydoc_char_shards_hold_exactly_pydocs_texts_and_blocks(pydoc_shards):
    meta, facts = load_json(pydoc_shards / "meta.json"), get_dataset("tokens").facts(data_dir=str(pydoc_shards))
    assert facts == get_dataset("pydoc").facts()  # the same vocabulary: bits per character and generation alike
    vocab = text.codec(facts)
    for split, whole in zip(("train", "test"), text.pydoc_corpus()):
        assert vocab.decode(ids_of(pydoc_shards, split)) == whole
        assert meta["splits"][split] == dict(tokens=len(whole), characters=len(whole), characters_per_token=1.0)
    assert (meta["level"], meta["dtype"], meta["source"]["input"]) == ("char", "uint16", "pydoc")
    ours, theirs = get_dataset("tokens").read(data_dir=str(pydoc_shards)), get_dataset("pydoc").read()
    for mine, its in zip(ours, theirs):  # pydoc's test split is under EVAL_BLOCKS blocks: whole
        assert len(mine) == len(its)
        for k in range(len(its)):
            assert all(torch.equal(a, b) and a.dtype == torch.int64 for a, b in zip(mine[k], its[k]))


def write_corpus(folder, text_=None, name="book.txt"):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    body = text_ or "\n".join(f"Line {i}: {ODD} the quick brown fox jumps over the lazy dog." for i in range(120))
    path.write_text("\n \t" + body + " \n\n")  # leading and trailing whitespace, which text strips
    return path


def test_a_folder_streamed_in_small_chunks_gets_the_ids_that_dataset_text_gives(tmp_path, capsys, monkeypatch):
    """Chunks of 7 bytes cut characters of 2 to 4 bytes and the whitespace that is stripped; BPE
    pieces of 50 characters are many cuts. Both tokenizers give `--dataset text`'s ids exactly."""
    write_corpus(tmp_path / "books" / "b")
    write_corpus(tmp_path / "books" / "a", "\n".join(f"{i} ☃ snow" for i in range(300)), name="c.txt")
    (tmp_path / "books" / "notes.md").write_text("not read")
    monkeypatch.setattr(prepare_text, "CHUNK_BYTES", 7)
    monkeypatch.setattr(prepare_text, "BPE_PIECE", 50)
    where = str(tmp_path / "books")
    for tokenizer, more in (("char", []), ("bpe", ["--vocab-size", "300"])):
        out = tmp_path / tokenizer
        code, lines, _ = prepare(capsys, "--input", where, "--tokenizer", tokenizer, *more, "--out", out)
        assert code == 0 and [line.split(":")[0] for line in lines[-3:-1]] == ["train", "test"], lines
        vocab = text.make_tokenizer(where, tokenizer, 300, "text")
        for split, whole in zip(("train", "test"), text.corpus(where, "text")):
            assert ids_of(out, split).tolist() == vocab.encode(whole), (tokenizer, split)
        assert get_dataset("tokens").facts(data_dir=str(out)) == get_dataset("text").facts(
            data_dir=where, tokenizer=tokenizer, vocab_size=300)
    meta = load_json(tmp_path / "bpe" / "meta.json")
    assert meta["bpe_sample_characters"] == len(text.corpus(where, "text")[0]) and "bpe: 300 tokens" in lines[0]


def test_bpe_trained_on_a_bounded_sample_round_trips_and_a_run_saves_it_and_generates(tmp_path, capsys):
    book = write_corpus(tmp_path)
    code, lines, _ = prepare(capsys, "--input", book, "--tokenizer", "bpe", "--vocab-size", "300",
                             "--bpe-sample-mb", "0.002", "--out", tmp_path / "bpe")
    meta = load_json(tmp_path / "bpe" / "meta.json")
    assert code == 0 and 1000 < meta["bpe_sample_characters"] <= 2000 and meta["bpe_sample_mb"] == 0.002
    assert f"trained on the first {meta['bpe_sample_characters']:,} characters" in lines[0]
    bpe = text.codec(get_dataset("tokens").facts(data_dir=str(tmp_path / "bpe")))
    for split, whole in zip(("train", "test"), text.corpus(str(book), "text")):
        ids = ids_of(tmp_path / "bpe", split)
        assert bpe.decode(ids) == whole and sum(meta["token_chars"][i] for i in ids) == len(whole)
        assert meta["splits"][split]["characters"] == len(whole) and meta["splits"][split]["tokens"] == len(ids)
    from common.generate import main as generate

    run = tmp_path / "run"
    assert train(["--paper", "gpt", "--dataset", "tokens", "--data-dir", str(tmp_path / "bpe"), "--block-size", "16",
                  "--batch-size", "8", "--max-steps", "2", "--wandb", "disabled", "--results-dir",
                  str(tmp_path / "r"), "--out", str(run)]) == 0
    assert (run / "tokenizer.json").read_text() == meta["tokenizer"]
    capsys.readouterr()
    assert generate(["--run", str(run), "--prompt", "☃ The", "--tokens", "6"]) == 0
    assert capsys.readouterr().out.startswith("☃ The")


def test_a_vocabulary_beyond_65536_ids_is_stored_as_uint32(tmp_path, capsys):
    assert [tokens.token_dtype(n) for n in (256, 2**16, 2**16 + 1, 200_000)] == ["uint16", "uint16", "uint32", "uint32"]
    points = [c for c in range(0x4E00, 0x10FFFF) if not 0xD800 <= c < 0xE000 and not chr(c).isspace()][:70_000]
    lines = ["".join(map(chr, points[i : i + 100])) for i in range(0, len(points), 100)]
    book = write_corpus(tmp_path, "\n".join(lines))
    assert prepare(capsys, "--input", book, "--out", tmp_path / "wide")[0] == 0
    meta = load_json(tmp_path / "wide" / "meta.json")
    assert (meta["dtype"], meta["vocab_size"]) == ("uint32", 70_002)  # and <unk>, and the line break
    vocab = text.codec(get_dataset("tokens").facts(data_dir=str(tmp_path / "wide")))
    assert vocab.decode(ids_of(tmp_path / "wide", "train")) + vocab.decode(ids_of(tmp_path / "wide", "test")) == \
        "\n".join(lines)


# GPT's tiny flavor made smaller (2 layers of 64) so that two runs of 200 steps fit the test's time
SMALL = ["--paper", "gpt", "--max-steps", "200", "--block-size", "64", "--batch-size", "32", "--model-kwargs",
         "n_layer=2", "n_embd=64", "n_head=4", "--wandb", "disabled"]


def test_gpt_on_pydoc_token_shards_reaches_pydocs_bits_per_character_and_resumes_bitwise(pydoc_shards, tmp_path):
    """The issue's acceptance: the same model on the same blocks, in another order (ChunkedOrder), ends
    within 0.05 bits per character of `--dataset pydoc`; both well below the unigram's 4.6. Then a run
    stopped mid-epoch (the epoch is 208 steps) resumes to the uninterrupted run's weights."""
    flags = SMALL + ["--results-dir", str(tmp_path / "r")]
    assert train(flags + ["--out", str(tmp_path / "pydoc")]) == 0
    assert train(flags + ["--dataset", "tokens", "--data-dir", str(pydoc_shards), "--ckpt-every", "150",
                          "--out", str(tmp_path / "tokens")]) == 0
    pydoc, shards = (load_json(tmp_path / run / "result.json")["final"] for run in ("pydoc", "tokens"))
    assert abs(shards - pydoc) < 0.05 and shards < 3.6, (shards, pydoc)
    resumed = interrupted_copy(tmp_path / "tokens", 150, tmp_path / "resumed")
    assert train(["--resume", str(resumed)]) == 0
    assert bitwise_equal(weights(resumed), weights(tmp_path / "tokens"))


def test_ranks_read_disjoint_blocks_that_together_are_the_epoch(pydoc_shards):
    train_set, _ = get_dataset("tokens").read(data_dir=str(pydoc_shards))
    seen = []
    for rank in (0, 1):
        loader = train_loader(train_set, 64, 32, rank, 2, seed=0)
        loader.epoch_sampler.set_epoch(1)
        indices = list(loader.epoch_sampler)
        x, y = next(iter(loader))
        assert torch.equal(x, torch.stack([train_set[i][0] for i in indices[:32]]))
        assert torch.equal(y, torch.stack([train_set[i][1] for i in indices[:32]]))
        seen.append(indices)
    assert not set(seen[0]) & set(seen[1]) and len(seen[0]) == len(seen[1]) == len(train_set) // 2
    assert set(seen[0]) | set(seen[1]) == set(range(len(train_set)))  # 3,336 blocks: none left out


class Numbers(Dataset):
    """n samples, sample i being i, in a ChunkedOrder of `chunk` (None: DistributedSampler's randperm)."""

    def __init__(self, n: int, chunk: int | None):
        self.n, self.shuffle_chunk = n, chunk

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def order(dataset, world_size: int, epoch: int, start: int = 0) -> list[list[int]]:
    """Each rank's samples of an epoch, from position `start` on."""
    ranks = []
    for rank in range(world_size):
        sampler = ResumableSampler(dataset, rank=rank, world_size=world_size, seed=7)
        sampler.set_epoch(epoch, start)
        ranks.append(list(sampler))
        assert len(ranks[-1]) == len(sampler)
    return ranks


def test_the_chunked_order_is_a_fresh_permutation_each_epoch_the_same_for_any_number_of_ranks():
    data = Numbers(10_007, chunk=100)  # 101 chunks of 99 or 100 samples
    (one,) = order(data, 1, epoch=0)
    assert sorted(one) == list(range(10_007)) and one != sorted(one)
    assert order(data, 1, epoch=1)[0] != one and sorted(order(data, 1, epoch=1)[0]) == sorted(one)
    assert one[:100] != sorted(one[:100]) and max(one[:100]) - min(one[:100]) > 9000  # a chunk spans the data
    for world_size in (2, 3, 4):
        ranks = order(data, world_size, epoch=0)
        together = [ranks[p % world_size][p // world_size] for p in range(len(ranks[0]) * world_size)]
        assert together == one[: len(together)] and len(one) - len(together) < world_size
        for start in (0, 6 * world_size, 1234 * world_size):  # a resumed epoch goes on exactly
            assert order(data, world_size, epoch=0, start=start) == [r[start // world_size:] for r in ranks]
    assert list(ChunkedOrder(5, seed=0, chunk=100)) != list(range(5)) and list(ChunkedOrder(1, 0, 100)) == [0]
    eager = Numbers(10_007, chunk=None)  # every other data set keeps DistributedSampler's order
    expected = torch.randperm(10_007, generator=torch.Generator().manual_seed(7)).tolist()
    assert order(eager, 1, epoch=0)[0] == expected


def peak_bytes(sampler) -> tuple[int, int]:
    """(samples read, tracemalloc's peak while reading them)."""
    tracemalloc.start()
    try:
        read = sum(1 for _ in sampler)
        return read, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_epoch_of_50_million_blocks_is_read_without_its_permutation_in_memory():
    """One rank of 64 walks all 763 chunks of an epoch of 50 million blocks (a 1 GB corpus at character
    level is 7.8 million blocks of 128): the peak is a chunk of 65,536 ids, not the 50 million (a Python
    list of them is 1.8 GB). The same measure does see DistributedSampler's permutation of a million.
    (Every rank draws every chunk's order; one of 64 keeps the test short: iterating is what it costs.)"""
    big = ResumableSampler(Numbers(50_000_000, chunk=tokens.SHUFFLE_CHUNK), rank=0, world_size=64, seed=0)
    big.set_epoch(3, start=64 * 1000)
    read, peak = peak_bytes(big)
    assert read == len(big) == 50_000_000 // 64 - 1000 and peak < 4 * 2**20, peak
    read, peak = peak_bytes(ResumableSampler(Numbers(1_000_000, chunk=None), rank=0, world_size=64, seed=0))
    assert read == 1_000_000 // 64 and peak > 30 * 2**20, peak


def test_reading_blocks_leaves_no_file_pages_mapped(tmp_path):
    """Resident file pages (RssFile) stay as they were after 400 random blocks of a 32 MB shard; one
    memmap kept open would hold every page it touched (here about the whole file)."""
    import random
    import re
    from pathlib import Path

    status = Path("/proc/self/status")
    if not status.exists() or "RssFile" not in status.read_text():
        pytest.skip("RssFile is Linux's")
    mapped = lambda: int(re.search(r"RssFile:\s+(\d+) kB", status.read_text()).group(1)) * 1024  # noqa: E731
    np.arange(16 * 2**20, dtype=np.uint16).tofile(tmp_path / "train.bin")
    blocks, pick = tokens.TokenBlocks(tmp_path / "train.bin", "uint16", 128), random.Random(0)
    before = mapped()
    for _ in range(400):
        k = pick.randrange(len(blocks))
        assert blocks[k][0][0] == (k * 128) % 2**16
    assert mapped() - before < 2 * 2**20


def test_each_mistake_in_token_shards_is_one_line_exit_2_and_nothing_written(pydoc_shards, tmp_path, capsys):
    def broken(name: str, file: str, content: bytes | None) -> str:
        """A copy of the pydoc shards with one file rewritten (None: removed)."""
        folder = tmp_path / name
        shutil.copytree(pydoc_shards, folder)
        (folder / file).unlink() if content is None else (folder / file).write_bytes(content)
        return str(folder)

    meta = load_json(pydoc_shards / "meta.json")
    n = meta["splits"]["train"]["tokens"]
    wide = json.dumps(meta | {"dtype": "uint32"}).encode()
    short = write_corpus(tmp_path / "short", "\n".join(["A line of text."] * 60))
    assert prepare_text.main(["--input", str(short), "--out", str(tmp_path / "short-shards")]) == 0
    test_tokens = load_json(tmp_path / "short-shards" / "meta.json")["splits"]["test"]["tokens"]
    cases = [
        ([], "--dataset tokens reads --data-dir"),
        (["--data-dir", str(tmp_path / "missing")], "does not exist"),
        (["--data-dir", broken("no-meta", "meta.json", None)], "holds no meta.json"),
        (["--data-dir", broken("no-test", "test.bin", None)], "test.bin is missing"),
        (["--data-dir", broken("cut", "train.bin", b"\0" * 10)], f"train.bin holds 10 bytes, but meta.json says {n:,} "
                                                                 f"uint16 tokens ({2 * n:,} bytes)"),
        (["--data-dir", broken("wide", "meta.json", wide)], f"train.bin holds {2 * n:,} bytes, but meta.json says "
                                                           f"{n:,} uint32 tokens ({4 * n:,} bytes)"),
        (["--data-dir", broken("json", "meta.json", b"{")], "meta.json is not one that prepare_text wrote"),
        (["--data-dir", str(tmp_path / "short-shards")], f"the test split of {tmp_path / 'short-shards'} is "
                                                         f"{test_tokens} tokens, fewer than one block of 128 + 1"),
        (["--data-dir", str(pydoc_shards), "--tokenizer", "bpe"], "--tokenizer and --vocab-size do not apply to tokens"),
    ]
    for flags, words in cases:
        line = refused(capsys, ["--paper", "gpt", "--dataset", "tokens", *flags, "--wandb", "disabled",
                                "--out", str(tmp_path / "run")])
        assert line.startswith("train.py: error: ") and words in line, (line, words)
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("content, args, words", [
    (b"", [], "is empty"),
    (b" \n\t\n", [], "is empty"),
    (b"x", [], "holds 1 characters, too few to split"),
    ("café\n".encode("latin-1"), [], "is not UTF-8 text: byte 3 (0xe9) does not decode"),
    (b"text\n\x00\x01", [], "is not text: byte 5 is NUL"),
    (b"some text\nmore\n", ["--vocab-size", "300"], "--vocab-size and --bpe-sample-mb go with --tokenizer bpe"),
    (b"some text\nmore\n", ["--tokenizer", "bpe", "--vocab-size", "100"], "use more than 256"),
    (b"some text\nmore\n", ["--tokenizer", "word"], "invalid choice: 'word'"),
])
def test_prepare_text_refuses_bad_input_in_one_line_and_writes_nothing(content, args, words, tmp_path, capsys):
    (tmp_path / "in.txt").write_bytes(content)
    code, out, err = prepare(capsys, "--input", tmp_path / "in.txt", *args, "--out", tmp_path / "out")
    assert code == 2 and len(err) == 1 and words in err[0] and not out, err
    assert err[0].startswith("prepare_text: error: ") and not (tmp_path / "out").exists()


def test_prepare_text_keeps_shards_unless_forced_and_leaves_nothing_when_it_fails(pydoc_shards, tmp_path, capsys,
                                                                                 monkeypatch):
    for where, words in ((tmp_path / "none", "does not exist"), (tmp_path, "holds no .txt file")):
        code, _, err = prepare(capsys, "--input", where, "--out", tmp_path / "out")
        assert code == 2 and len(err) == 1 and words in err[0] and not (tmp_path / "out").exists()
    book, before = write_corpus(tmp_path / "in"), tree_snapshot(pydoc_shards)
    code, _, err = prepare(capsys, "--input", book, "--out", pydoc_shards)
    assert code == 2 and "already holds shards (train.bin, test.bin, meta.json)" in err[0] and "--force" in err[0]
    assert tree_snapshot(pydoc_shards) == before
    forced = tmp_path / "forced"
    shutil.copytree(pydoc_shards, forced)
    assert prepare(capsys, "--input", book, "--out", forced, "--force")[0] == 0
    assert load_json(forced / "meta.json")["source"]["input"] == str(book.resolve())

    def fail(self, piece):
        raise RuntimeError("disk full")

    monkeypatch.setattr(prepare_text.CharEncoder, "encode", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        prepare_text.main(["--input", str(book), "--out", str(tmp_path / "half")])
    assert not (tmp_path / "half").exists()
