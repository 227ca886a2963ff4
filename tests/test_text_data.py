"""Text for language models: --tokenizer bpe (byte-level, HF tokenizers) and `text` from --data-dir."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.data import get_dataset, text
from common.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
ODD = "naïve café: ☃ 雪 — \u0301e\n\ttabs and emoji 🐍"  # characters of 1 to 4 UTF-8 bytes, and a lone accent


def test_bpe_is_trained_on_the_training_split_to_the_vocabulary_size_and_round_trips_any_text():
    facts = get_dataset("pydoc").facts(tokenizer="bpe", vocab_size=512)
    assert facts["vocab_size"] == 512 and facts["level"] == "bpe" and len(facts["token_chars"]) == 512
    bpe = text.codec(facts)
    train_text, test_text = text.corpus()
    for sample in (test_text, ODD, "x"):
        ids = bpe.encode(sample)
        assert bpe.decode(ids) == sample  # bytes cover every character: nothing becomes <unk>
        assert sum(facts["token_chars"][i] for i in ids) == len(sample)  # bits per character count characters
    assert len(bpe.encode(test_text)) < 0.5 * len(test_text)  # merges: fewer tokens than characters
    # the merges come from the training split: a word only the test text holds is not one token
    assert bpe.encode(" the") != bpe.encode(" thé") and len(bpe.encode(" the")) == 1
    train, test = get_dataset("pydoc").read(tokenizer="bpe", vocab_size=512, block_size=32)
    x, y = train[2]
    assert x.shape == (32,) and torch.equal(x[1:], y[:-1]) and bpe.decode(x) in train_text
    assert len(train) == (len(bpe.encode(train_text)) - 1) // 32


@pytest.mark.slow  # trains, exports or compiles: the whole suite's, not the everyday lane's
def test_every_process_trains_the_same_bpe():
    """Each rank of a launch trains its own tokenizer: it must be the same one."""
    code = ("import hashlib; from common.data import text; "
            "print(hashlib.sha256(text.make_tokenizer(tokenizer='bpe', vocab_size=700).tokenizer.to_str().encode())"
            ".hexdigest())")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=ROOT).stdout.strip()
            for _ in range(2)}
    import hashlib

    here = hashlib.sha256(text.make_tokenizer(tokenizer="bpe", vocab_size=700).tokenizer.to_str().encode()).hexdigest()
    assert runs == {here}


def test_bits_per_character_do_not_depend_on_the_tokenizer_for_the_same_probabilities():
    """A model giving every character of a text probability p scores -log2 p bits per character at
    character level; a BPE token of n characters then has probability p^n and scores the same."""
    from common.tasks import get_task

    facts = get_dataset("pydoc").facts(tokenizer="bpe", vocab_size=400)
    bpe, p = text.codec(facts), 0.25
    ids = torch.tensor([bpe.encode(text.corpus()[1][:2000])])
    chars = torch.tensor(facts["token_chars"], dtype=torch.float64)[ids]  # (1, T)
    logits = torch.full((1, ids.shape[1], 400), -1e4, dtype=torch.float64)
    logits.scatter_(2, ids[..., None], (chars * torch.log(torch.tensor(p, dtype=torch.float64)))[..., None])
    # the other tokens share what is left, so the softmax gives the target p^n
    rest = torch.log((1 - p ** chars) / 399)
    logits = torch.where(logits == -1e4, rest[..., None].expand_as(logits), logits)
    task = get_task("language-modeling", facts)
    metrics = task.build_metrics(torch.device("cpu"))
    task.update(metrics, logits, ids)
    assert task.compute(metrics)["bits_per_char"] == pytest.approx(2.0, rel=1e-6)


def write_book(folder, name="book.txt", lines=400):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(lines)) + "\n")
    return path


def test_text_reads_a_file_or_a_folders_txt_files_split_90_10_at_a_line_break(tmp_path):
    data = get_dataset("text")
    assert (data.task, data.inputs, data.reads_folder) == ("language-modeling", "tokens", True)
    book = write_book(tmp_path / "one")
    train, test = text.corpus(str(book), "text")
    assert train + test == book.read_text().strip() and train.endswith("\n")
    assert 0.89 < len(train) / (len(train) + len(test)) < 0.92 and test.startswith("Line ")
    b, a = write_book(tmp_path / "many", "b.txt", 100), write_book(tmp_path / "many" / "sub", "a.txt", 300)
    (tmp_path / "many" / "notes.md").write_text("not read")
    train, test = text.corpus(str(tmp_path / "many"), "text")
    assert train + test == b.read_text().strip() + "\n\n" + a.read_text().strip()  # in order of their paths
    facts = data.facts(data_dir=str(book))
    assert facts["level"] == "char" and facts["vocab_size"] == len(set(book.read_text())) + 1  # and <unk>
    train, test = data.read(data_dir=str(book), block_size=16, tokenizer="bpe", vocab_size=300)
    assert train[0][0].shape == (16,) and len(test) > 0
    b.write_text("Changed text.\n" * 200)  # a file changed on disk is read again
    assert text.corpus(str(tmp_path / "many"), "text")[0].startswith("Changed text.")


@pytest.mark.parametrize("content, words", [
    (b"", ["is empty"]),
    (b"  \n\n", ["is empty"]),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ["is not text", "NUL bytes"]),
    ("café\n".encode("latin-1"), ["is not UTF-8 text", "byte 3", "0xe9"]),
    (b"x", ["holds 1 characters, too few to split"]),
])
def test_an_empty_binary_or_short_file_is_one_error_naming_it(content, words, tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    for call in (lambda: get_dataset("text").facts(data_dir=str(path)),
                 lambda: get_dataset("text").read(data_dir=str(path))):
        with pytest.raises(ConfigError) as error:
            call()
        message = str(error.value)
        assert len(message.splitlines()) == 1 and message.startswith("--dataset text: ") and str(path) in message
        assert all(word in message for word in words), message


def test_a_folder_with_one_bad_file_names_that_file_and_a_path_without_text_is_one_error(tmp_path):
    write_book(tmp_path / "books", "a.txt")
    (tmp_path / "books" / "b.txt").write_bytes(b"\x00\x01\x02")
    with pytest.raises(ConfigError, match=f"{tmp_path / 'books' / 'b.txt'} is not text"):
        get_dataset("text").facts(data_dir=str(tmp_path / "books"))
    (tmp_path / "empty").mkdir()
    for where, words in (("empty", "holds no .txt file"), ("missing", "does not exist"), (None, "reads --data-dir")):
        with pytest.raises(ConfigError, match=words):
            get_dataset("text").facts(data_dir=where and str(tmp_path / where))
    write_book(tmp_path / "small")
    with pytest.raises(ConfigError, match="the test text of .* is 2,144 tokens, fewer than one block of 4096"):
        get_dataset("text").read(data_dir=str(tmp_path / "small"), block_size=4096)


@pytest.mark.parametrize("flags, words", [
    (["--paper", "resnet", "--tokenizer", "bpe"], "--tokenizer bpe splits text into tokens; digits has image inputs"),
    (["--paper", "gpt", "--vocab-size", "500"], "--vocab-size sizes a BPE vocabulary; add --tokenizer bpe"),
    (["--paper", "gpt", "--tokenizer", "bpe", "--vocab-size", "200"], "use more than 256"),
])
def test_tokenizer_flags_that_do_not_apply_are_one_error(flags, words):
    from common.config import resolve, validate

    with pytest.raises(ConfigError, match=words):
        validate(resolve({k.lstrip("-").replace("-", "_"): (int(v) if v.isdigit() else v)
                          for k, v in zip(flags[::2], flags[1::2])}))


def test_train_py_says_which_file_is_bad_in_one_line_and_exits_2(tmp_path, capsys):
    from train import main

    bad = tmp_path / "data" / "picture.txt"
    bad.parent.mkdir()
    bad.write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF")
    flags = ["--paper", "gpt", "--dataset", "text", "--wandb", "disabled", "--results-dir", str(tmp_path / "r")]
    assert main(flags + ["--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "is not text" in err[0], err
    assert not (tmp_path / "run").exists()
    bad.write_text("A line of text.\n" * 20)  # 320 characters: a test split shorter than a block
    assert main(flags + ["--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the test text of" in err[0] and "fewer than one block of 128 + 1" in err[0], err


def test_a_bpe_run_saves_its_tokenizer_and_generates_from_a_prompt_of_unseen_characters(tmp_path, capsys):
    from common.generate import main as generate
    from train import main

    book = write_book(tmp_path / "data")
    flags = ["--paper", "gpt", "--dataset", "text", "--data-dir", str(book), "--block-size", "16", "--batch-size", "8",
             "--max-steps", "2", "--wandb", "disabled", "--results-dir", str(tmp_path / "r")]
    assert main(flags + ["--tokenizer", "bpe", "--vocab-size", "300", "--out", str(tmp_path / "bpe")]) == 0
    config = json.loads((tmp_path / "bpe" / "config.json").read_text())
    assert (config["tokenizer"], config["vocab_size"]) == ("bpe", 300)
    saved = (tmp_path / "bpe" / "tokenizer.json").read_text()
    assert saved == get_dataset("text").facts(data_dir=str(book), tokenizer="bpe", vocab_size=300)["tokenizer"]
    assert json.loads(saved)["model"]["type"] == "BPE"
    assert main(flags + ["--out", str(tmp_path / "char")]) == 0
    assert not (tmp_path / "char" / "tokenizer.json").exists()
    for run in ("bpe", "char"):
        capsys.readouterr()
        args = ["--run", str(tmp_path / run), "--prompt", "☃ The 🐍", "--tokens", "12", "--seed", "3"]
        assert generate(args) == 0
        out = capsys.readouterr().out
        assert out.startswith("☃ The 🐍") and len(out) > len("☃ The 🐍"), out
        assert generate(args) == 0 and capsys.readouterr().out == out  # a seed repeats
