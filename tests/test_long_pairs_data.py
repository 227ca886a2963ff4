"""The `long-pairs` data set (a toy English -> French of 5 to 49 words, common.data.long_pairs), both
translation papers training on it, and the per-length scoring of Bahdanau et al.'s Figure 2
(papers/bahdanau/claims/length.py)."""

import itertools
import json
import math
from collections import Counter

import pytest
import torch

from common.data import get_dataset
from common.data import long_pairs as lp
from common.tasks import Seq2Seq, get_task
from common.translate import source_ids
from papers.bahdanau.claims import length
from tests.conftest import load_json, made_once, refused
from train import main

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

# A bin's BLEU is a corpus BLEU over its sentences: with 100 of them one sentence is 1% of the bin's
# n-grams, so that no single sentence moves a bin's score by much more than a point, and the shortest
# bin still counts 500 source words. 100 is also what a test split of 900 (evaluated every epoch in
# about 15 s on the CPU) gives to each of 9 bins.
MIN_PER_BIN = 100


def test_the_splits_have_their_sizes_and_every_length_alike():
    train, test = get_dataset("long-pairs").read()
    assert (len(train), len(test)) == (lp.TRAIN_SIZE, lp.TEST_SIZE) == (10_800, 900)
    lengths = list(range(5, 50))
    assert Counter(test.sizes) == {n: 20 for n in lengths} and Counter(train.sizes) == {n: 240 for n in lengths}
    for split in (train, test):
        assert split.sizes == [len(s.split()) for s, _ in split.texts] == [len(s) for s, _ in split]
    bins = Counter(lp.length_bin(n) for n in test.sizes)
    assert sorted(bins) == list(range(5, 50, 5)) and min(bins.values()) >= MIN_PER_BIN
    assert [lp.length_bin(n) for n in (5, 9, 10, 44, 45, 49)] == [5, 5, 10, 40, 45, 45]


def test_two_loads_are_the_same_pairs():
    train, test = lp.load()
    again_train, again_test = lp.load.__wrapped__()  # drawn afresh, not the cached copy
    assert again_train is not train and again_train.texts == train.texts and again_test.texts == test.texts
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(again_train, train))
    # the fixed seeds' draw, the same on every machine and Python version
    assert test.texts[0] == ("some boxes pull the churches", "des boîtes tirent les églises")
    assert train.texts[0] == ("the doctors hear the horse without a fox", "les médecins entendent le cheval sans un renard")


def test_no_source_is_in_both_splits_or_twice_in_one():
    train, test = lp.load()
    train_sources, test_sources = [s for s, _ in train.texts], [s for s, _ in test.texts]
    assert not set(train_sources) & set(test_sources)
    assert len(set(train_sources)) == len(train_sources) and len(set(test_sources)) == len(test_sources)


@pytest.mark.parametrize("source, target", [
    # adjectives after the noun in mirror order, the article and adjectives feminine singular
    ("the big red car sees a small house", "la voiture rouge grande voit une maison petite"),
    # plural: some -> des, feminine plural adjectives; the adverb after the verb; a number
    ("some old women often find the three white horses",
     "des femmes anciennes trouvent souvent les trois chevaux blancs"),
    # near -> près de, and de + le -> du
    ("a happy boy reads the new book near the old bridge", "un garçon heureux lit le livre nouveau près du pont ancien"),
    # de + les -> des, de + des -> de; a two-word conjunction
    ("the cats eat some cakes near the big houses because a girl draws the tree near some boats",
     "les chats mangent des gâteaux près des maisons grandes parce que une fille dessine le arbre près de bateaux"),
    # adjectives with all four forms given (beau, fier, doux, blanc)
    ("the beautiful proud queens greet a gentle king", "les reines fières belles saluent un roi doux"),
    ("a beautiful white goat hears a tall child", "une chèvre blanche belle entend un enfant haut"),
])
def test_the_translation_rules_on_sentences_checked_by_hand(source, target):
    assert lp.translate(source) == target


def test_every_pair_is_the_rule_applied_and_needs_reordering():
    train, test = lp.load()
    assert all(lp.translate(s) == t for s, t in test.texts + train.texts[:2000])
    # a target is not its source translated word by word in place: every article agrees with a noun that
    # comes later, and in most sentences adjectives or adverbs move (not in 5-word ones: no room for them)
    moved = sum(any(w in lp.ADJECTIVE or w in lp.ADVERBS for w in s.split()) for s, _ in test.texts)
    assert moved > 0.85 * len(test)
    assert len(lp.NOUNS) == 65 and {g for *_, g in lp.NOUNS} == {"m", "f"}
    assert (len(lp.ADJECTIVES), len(lp.VERBS)) == (40, 38)
    # every English word has one part of speech (translate reads them by it)
    kinds = [set(lp.DETERMINERS), set(lp.NOUN), set(lp.ADJECTIVE), set(lp.VERB), set(lp.NUMBERS), set(lp.ADVERBS),
             set(lp.PREPOSITIONS), set(lp.CONJUNCTIONS)]
    assert all(not a & b for a, b in itertools.combinations(kinds, 2))


def test_facts_name_both_word_vocabularies_and_every_pair_encodes_without_unk():
    facts = get_dataset("long-pairs").facts()
    src, tgt = lp.vocabularies()
    assert facts == dict(src_vocab=283, tgt_vocab=381, pad_id=0, bos_id=1, eos_id=2, itos=tgt.itos,
                         src_itos=src.itos, src_stoi=src.stoi, level="word", max_target_length=lp.MAX_TARGET + 1)
    assert src.itos[:4] == tgt.itos[:4] == ["<pad>", "<s>", "</s>", "<unk>"] and len(src) == 4 + 279
    assert src.itos[4:] == sorted(src.itos[4:]) and "voiture" in tgt.stoi and "car" in src.stoi
    train, test = lp.load()
    text = get_task("seq2seq", facts).text
    for (source, target), (s, t) in zip(test.texts + train.texts[:500], list(test) + [train[i] for i in range(500)]):
        assert lp.UNK not in s.tolist() and lp.UNK not in t.tolist() and lp.PAD not in s.tolist()
        assert int(t[-1]) == lp.EOS and lp.EOS not in t[:-1].tolist()
        assert text(t) == target and source_ids(source, facts) == s.tolist()  # as common.translate reads it
    assert source_ids("the zebra", facts) == [src.stoi["the"], lp.UNK]
    longest = max(len(t) for split in (train, test) for _, t in split)  # decoding's limit: the longest target
    assert longest == lp.MAX_TARGET + 1 == facts["max_target_length"]  # (its words and </s>)


@pytest.mark.parametrize("flags, words", [
    (["--paper", "bahdanau", "--seq-len", "30"], ["--seq-len", "long-pairs has its own"]),
    (["--paper", "lenet"], ["lenet reads image inputs", "long-pairs has pairs inputs"]),
])
def test_what_the_data_set_does_not_take_is_one_line(flags, words, capsys):
    line = refused(capsys, flags + ["--dataset", "long-pairs", "--wandb", "disabled"])
    assert all(w in line for w in words), line


# ---------------------------------------------------------------- training, and BLEU by length


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two steps of each translation paper's tiny flavor on long-pairs, through train.py."""
    def make(out):
        for paper in ("gru", "bahdanau"):
            assert main(["--paper", paper, "--dataset", "long-pairs", "--max-steps", "2", "--batch-size", "16",
                         "--wandb", "disabled", "--eval-samples", "64", "--out", str(out / paper),
                         "--results-dir", str(out / "results")]) == 0

    return made_once(tmp_path_factory, "long-pairs", make)


@pytest.mark.parametrize("paper", ["gru", "bahdanau"])
def test_both_translation_papers_train_on_it(runs, paper):
    r = load_json(runs / paper / "result.json")
    assert (r["paper"], r["flavor"], r["dataset"], r["task"], r["steps"]) == (paper, "tiny", "long-pairs", "seq2seq", 2)
    assert 0 <= r["final_metrics"]["bleu"] <= 100 and math.isfinite(r["final_metrics"]["loss"])
    assert (runs / paper / "model.safetensors").stat().st_size > 1_000_000  # 339,517 / 512,061 float32s


def test_bleu_by_length_scores_every_bin_of_the_test_split(runs):
    """Each bin's first 4 sentences (an untrained decoder runs to its longest output: the whole split is
    the oracle's test, below)."""
    scores = length.bleu_by_length(runs / "bahdanau", per_bin=4)
    assert list(scores) == [str(n) for n in range(5, 50, 5)] + ["all"]
    assert all(0 <= s["bleu"] <= 100 and 0 <= s["exact_match"] <= 1 for s in scores.values())
    assert [s["sentences"] for k, s in scores.items() if k != "all"] == [4] * 9 and scores["all"]["sentences"] == 36


def test_bleu_by_length_keeps_the_bins_apart(runs, monkeypatch):
    """A decoder right on sources of 25 words or more and silent on the others: 100 in those bins, 0 below."""
    def oracle(self, model, inputs, targets):
        long = (inputs["src_lengths"] >= 25)[:, None]
        return {"logits": torch.zeros(*targets.shape, 381), "tokens": torch.where(long, targets, lp.EOS)}

    monkeypatch.setattr(Seq2Seq, "forward", oracle)
    scores = length.bleu_by_length(runs / "gru")
    assert sum(s["sentences"] for k, s in scores.items() if k != "all") == scores["all"]["sentences"] == lp.TEST_SIZE
    assert [scores[str(n)]["bleu"] for n in range(5, 50, 5)] == [0.0] * 4 + [pytest.approx(100.0)] * 5
    assert [scores[str(n)]["exact_match"] for n in range(5, 50, 5)] == [0.0] * 4 + [1.0] * 5
    assert 0 < scores["all"]["bleu"] < 100 and scores["all"]["exact_match"] == pytest.approx(5 / 9)


def test_the_claim_summarises_seeds_per_bin_and_draws_the_figure(tmp_path, capsys):
    bins = [str(n) for n in range(5, 50, 5)] + ["all"]
    def runs_of(bleu):  # three seeds' scores, bleu(bin's first length or 5 for "all", seed)
        return {str(seed): {"run_id": f"run{seed}", "bleu": {b: {"bleu": bleu(5 if b == "all" else int(b), seed),
                                                                "exact_match": 0.5, "sentences": 100} for b in bins}}
                for seed in range(3)}

    fall, flat = runs_of(lambda first, seed: 60.0 - first + seed), runs_of(lambda first, seed: 80.0 + 2 * seed)
    rows = length.summary({"gru": fall, "bahdanau": flat})
    assert [r["bin"] for r in rows] == bins
    first, last = rows[0], rows[-2]  # 5-9 and 45-49
    assert first["gru"] == pytest.approx(56.0) and last["gru"] == pytest.approx(16.0) and last["bahdanau"] == 82.0
    assert last["gru_low"] < 16.0 < last["gru_high"] and last["gru_n"] == 3
    assert last["difference"] == pytest.approx(66.0) and last["low"] < 66.0 < last["high"]
    length.plot(rows, {"gru": fall, "bahdanau": flat}, tmp_path / "length.png")
    assert (tmp_path / "length.png").stat().st_size > 10_000
    # no runs of the sweep: one line, exit code 2, nothing written
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x.json").write_text(json.dumps({"sweep": {"name": "other"}}))
    capsys.readouterr()
    assert length.main(["--results-dir", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bahdanau-length" in err[0], err
