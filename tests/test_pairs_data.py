"""The `pairs` data set: sentence pairs read from a tab-separated file (Tatoeba / Anki), word level.

Not tested through train.py's main: no registered paper reads "pairs" inputs yet, so main stops at
the paper's kind of input before reading the file; the errors are tested at `read` and `facts`, which
raise the ConfigError that main turns into one line and exit 2."""

from collections import Counter

import pytest
import torch

from common.data import get_dataset, pairs
from common.errors import ConfigError

PAIRS = [
    ("Go.", "Va !"), ("Hi.", "Salut !"), ("Run!", "Cours !"), ("Run!", "Courez !"), ("Who?", "Qui ?"),
    ("Wow!", "Ça alors !"), ("Fire!", "Au feu !"), ("Help!", "À l'aide !"), ("Jump.", "Saute."),
    ("Stop!", "Ça suffit !"), ("Stop!", "Stop !"), ("Wait!", "Attends !"), ("Wait!", "Attendez !"),
    ("Go on.", "Poursuis."), ("Go on.", "Continuez."), ("Hello!", "Bonjour !"), ("I see.", "Je comprends."),
    ("I try.", "J'essaye."), ("I won!", "J'ai gagné !"), ("I ran.", "J'ai couru."), ("Oh no!", "Oh non !"),
    ("Attack!", "Attaque !"), ("Cheers!", "Santé !"), ("Get up.", "Lève-toi."), ("Go now.", "Va, maintenant."),
    ("Got it!", "Compris !"), ("He ran.", "Il a couru."), ("Hop in.", "Monte."),
    ("Hug me.", "Serre-moi dans tes bras !"), ("I fell.", "Je suis tombé."),
]
ATTRIBUTION = "CC-BY 2.0 (France) Attribution: tatoeba.org #2877272 (CM) & #1158250 (Wittydev)"


def write(path, rows=PAIRS, end="\n"):
    """An Anki-style file: source, target and an attribution column, one pair a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{s}\t{t}\t{ATTRIBUTION}{end}" for s, t in rows), encoding="utf-8", newline="")
    return path


def read(path):
    return get_dataset("pairs").read(data_dir=str(path))


def test_the_split_is_fixed_disjoint_and_covers_every_line(tmp_path):
    train, test = read(write(tmp_path / "fra.txt"))
    assert (len(train), len(test)) == (27, 3)  # 10%, at least one
    assert not set(train.lines) & set(test.lines) and sorted(train.lines + test.lines) == list(range(1, 31))
    assert test.lines == [4, 11, 19]  # the fixed seed's draw, the same on every machine and Python version
    assert [PAIRS[n - 1] for n in train.lines] == train.texts and [PAIRS[n - 1] for n in test.lines] == test.texts
    again = read(write(tmp_path / "copy" / "pairs.tsv"))  # another path: read afresh, split alike
    assert again[1].texts == test.texts and again[0].texts == train.texts
    assert pairs.split(10)[1] == [7] and len(pairs.split(2)[1]) == 1  # a tenth, at least one
    # a folder holding the file reads the file; the zip's _about.txt and hidden files do not count
    (tmp_path / "_about.txt").write_text("Tab-delimited Bilingual Sentence Pairs\n")
    (tmp_path / ".notes.txt").write_text("mine\n")
    assert read(tmp_path)[1].texts == test.texts


def test_words_are_lowercased_and_split_from_punctuation():
    assert pairs.tokenize("Go.") == ["go", "."]
    assert pairs.tokenize("J'ai couru.") == ["j", "'", "ai", "couru", "."]
    assert pairs.tokenize("Va,\u202fmaintenant !") == ["va", ",", "maintenant", "!"]  # Tatoeba's narrow space
    assert pairs.tokenize("Ça suffit !") == ["ça", "suffit", "!"]


def test_vocabularies_come_from_training_words_seen_twice(tmp_path):
    rows = list(PAIRS)
    for i in pairs.split(len(rows))[1]:  # words seen only in the three test lines
        rows[i] = ("Zebra zebra.", "Zèbre zèbre !")
    train, test = read(write(tmp_path / "fra.txt", rows))
    src, tgt = pairs.vocabularies(str(tmp_path / "fra.txt"))
    for vocab, side in ((src, 0), (tgt, 1)):
        counts = Counter(w for text in train.texts for w in pairs.tokenize(text[side]))
        assert vocab.itos[:4] == ["<pad>", "<s>", "</s>", "<unk>"]
        kept = [w for w, n in counts.items() if n >= pairs.MIN_FREQ]
        assert vocab.itos[4:] == sorted(kept, key=lambda w: (-counts[w], w))  # most frequent, then a-z
        assert any(n == 1 for n in counts.values())  # some training words are left out
    assert pairs.MIN_FREQ == 2
    assert src.itos[4:7] == [".", "!", "go"] and tgt.itos[4:6] == ["!", "."]
    assert src.encode("Go, zebra!") == [src.stoi["go"], 3, 3, src.stoi["!"]]  # unknown words and marks are <unk>
    assert "zebra" not in src.stoi and "zèbre" not in tgt.stoi  # test words do not reach the vocabularies
    assert all(3 in s for s, _ in test)
    for source, target in list(train) + list(test):  # every target ends with </s>, and only there
        assert int(target[-1]) == pairs.EOS and pairs.EOS not in target[:-1].tolist()
        assert pairs.PAD not in source.tolist() and pairs.BOS not in source.tolist()
    i = train.texts.index(("Go on.", "Continuez."))
    assert src.decode(train[i][0]) == "go on ." and train.sizes[i] == 3 == len(train[i][0])
    assert train.sizes == [len(s) for s, _ in train]


def test_facts_name_both_vocabularies_and_encode_typed_text(tmp_path):
    path = str(write(tmp_path / "fra.txt"))
    facts = get_dataset("pairs").facts(data_dir=path, image_size=None)
    src, tgt = pairs.vocabularies(path)
    assert facts == dict(src_vocab=len(src), tgt_vocab=len(tgt), pad_id=0, bos_id=1, eos_id=2, itos=tgt.itos,
                         src_itos=src.itos, src_stoi=src.stoi, level="word")
    assert facts["src_vocab"] != facts["tgt_vocab"]  # two vocabularies
    assert pairs.encode_source("GO ON, Stranger.", path) == [src.stoi["go"], src.stoi["on"], 3, 3, src.stoi["."]]


def test_samples_collate_into_padded_batches(tmp_path):
    train, _ = read(write(tmp_path / "fra.txt"))
    samples = [train[i] for i in range(5)]
    inputs, targets = get_dataset("pairs").collate(4)(samples)
    S, T = max(len(s) for s, _ in samples), max(len(t) for _, t in samples)
    assert inputs["src"].shape == (5, -(-S // 4) * 4) and targets.shape == (5, T)
    assert inputs["src_lengths"].tolist() == [len(s) for s, _ in samples]
    assert inputs["mask"].sum(1).tolist() == inputs["src_lengths"].tolist()
    assert torch.equal(targets[0, :len(samples[0][1])], samples[0][1]) and (targets == pairs.EOS).sum() == 5


def test_windows_line_ends_a_byte_order_mark_and_no_final_newline_are_read(tmp_path):
    path = write(tmp_path / "fra.txt", end="\r\n")
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().removesuffix(b"\r\n"))
    train, test = read(path)
    assert sorted(train.texts + test.texts) == sorted(PAIRS)


def test_the_file_is_read_once_and_again_when_it_changes(tmp_path, monkeypatch):
    path = write(tmp_path / "fra.txt")
    parsed = []
    parse = pairs.parse
    monkeypatch.setattr(pairs, "parse", lambda p: parsed.append(p) or parse(p))
    spec = get_dataset("pairs")
    spec.facts(data_dir=str(path))
    train, _ = spec.read(data_dir=str(path))
    assert len(parsed) == 1 and spec.read(data_dir=str(path))[0] is train
    write(path, PAIRS[:20])
    assert len(spec.read(data_dir=str(path))[0]) == 18 and len(parsed) == 2


LINES = "Go.\tVa !\nHi.\tSalut !\n"


@pytest.mark.parametrize("content, words", [
    (LINES + "\nRun!\tCours !\n", ["line 3 is empty"]),
    (LINES + "  \t \nRun!\tCours !\n", ["line 3 is empty"]),
    (LINES + "\n", ["line 3 is empty"]),  # a blank line after the final newline
    (LINES + "Run! Cours !\n", ["line 3 has no tab", "'Run! Cours !'", "source<TAB>target"]),
    (LINES + " \tCours !\n", ["line 3 has an empty source"]),
    (LINES + "Run!\t \tCC-BY 2.0\n", ["line 3 has an empty target"]),
    ((LINES + "Coffee.\tUn café.\n").encode("latin-1"), ["line 3 is not UTF-8 text", "0xe9"]),
    (b"", ["is empty", "source<TAB>target"]),
    ("Go.\tVa !\n", ["holds 1 pair", "at least 2"]),
])
def test_a_bad_line_is_one_error_naming_the_file_and_the_line(content, words, tmp_path):
    path = tmp_path / "fra.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    for call in (read, lambda p: get_dataset("pairs").facts(data_dir=str(p))):
        with pytest.raises(ConfigError) as error:
            call(path)
        message = str(error.value)
        assert len(message.splitlines()) == 1 and message.startswith(f"--dataset pairs: {path}"), message
        assert all(word in message for word in words), message


@pytest.mark.parametrize("where, words", [
    ("missing", ["missing does not exist", ".txt or .tsv"]),
    ("empty", ["empty should hold exactly one .txt or .tsv file", "found none"]),
    ("two", ["two should hold exactly one", "found deu.tsv, fra.txt"]),
    ("pairs.csv", ["pairs.csv is not a .txt or .tsv file"]),
    (None, ["reads sentence pairs from --data-dir PATH", "source<TAB>target"]),
])
def test_a_path_without_one_pairs_file_is_one_error(where, words, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.md").write_text("not a pairs file\n")
    write(tmp_path / "two" / "fra.txt"), write(tmp_path / "two" / "deu.tsv")
    write(tmp_path / "pairs.csv")
    with pytest.raises(ConfigError) as error:
        get_dataset("pairs").read(data_dir=where and str(tmp_path / where))
    message = str(error.value)
    assert len(message.splitlines()) == 1 and all(word in message for word in words), message


def test_train_py_reports_a_bad_file_in_one_line_and_trains_on_a_good_one(tmp_path, capsys):
    from train import main

    bad = tmp_path / "bad.txt"
    bad.write_bytes((LINES + "Coffee.\tUn café.\n").encode("latin-1"))
    flags = ["--paper", "bahdanau", "--dataset", "pairs", "--wandb", "disabled", "--results-dir", str(tmp_path / "r")]
    assert main(flags + ["--data-dir", str(bad), "--out", str(tmp_path / "bad-run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "line 3 is not UTF-8 text" in err[0], err
    write(tmp_path / "fra.txt")
    assert main(flags + ["--data-dir", str(tmp_path / "fra.txt"), "--max-steps", "2", "--batch-size", "8",
                         "--out", str(tmp_path / "run")]) == 0
