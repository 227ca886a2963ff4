"""BERT's data side: WordPiece (Section 3.1), masking as the paper does (Section 3.1 "Task #1: Masked LM",
Appendix A.1) and the masked-LM loss and metrics."""

import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from common.data import text

ROOT = Path(__file__).resolve().parent.parent
SENTENCE = "The Parser reads Python's source: each token, then a tree of statements (PEP 8)."


@lru_cache(maxsize=2)
def small(vocab_size: int = 300, lowercase: bool = True) -> text.WordPiece:
    """A WordPiece trained on the first 30,000 characters of pydoc's training text (a twentieth of a second)."""
    return text.WordPiece.train(text.corpus()[0][:30_000], vocab_size, lowercase=lowercase)


def words(wp: text.WordPiece, s: str) -> list[str]:
    """s as WordPiece's normaliser and pre-tokenizer leave it: its words and punctuation marks."""
    tok = wp.tokenizer
    return [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(s))]


def test_wordpiece_puts_the_special_tokens_first_at_fixed_ids_and_learns_to_the_vocabulary_size():
    wp = small()
    assert len(wp) == 300 and wp.level == "wordpiece"
    assert (wp.pad_id, wp.unk_id, wp.cls_id, wp.sep_id, wp.mask_id) == (0, 1, 2, 3, 4) == tuple(wp.special_ids())
    assert [wp.tokenizer.id_to_token(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert wp.decode([2, 4, 3]) == "[CLS] [MASK] [SEP]"  # decode keeps the specials
    assert wp.encode("the [MASK] is") == [*wp.encode("the"), wp.mask_id, *wp.encode("is")]  # never split
    vocab = wp.tokenizer.get_vocab()
    assert "the" in vocab and any(t.startswith("##") for t in vocab)  # whole words and pieces inside words
    facts = wp.facts()
    assert (facts["vocab_size"], facts["level"], facts["mask_id"], facts["pad_id"]) == (300, "wordpiece", 4, 0)


def test_wordpiece_round_trips_a_sentence_up_to_its_normalisation():
    wp = small()
    ids = wp.encode(SENTENCE)
    assert wp.unk_id not in ids and wp.cls_id not in ids and wp.sep_id not in ids  # encode adds no specials
    assert len(ids) > len(words(wp, SENTENCE))  # some words are more than one piece
    # uncased: lowercased, split around punctuation, the words joined by one space
    assert wp.decode(ids) == " ".join(words(wp, SENTENCE)) == (
        "the parser reads python ' s source : each token , then a tree of statements ( pep 8 ) .")
    assert wp.encode(wp.decode(ids)) == ids
    cased = small(lowercase=False)
    assert cased.decode(cased.encode(SENTENCE)).startswith("The Parser reads Python ' s")


def test_wordpiece_maps_a_word_with_an_unknown_character_to_unk_whole():
    wp = small()
    assert wp.encode("☃") == [wp.unk_id]
    assert wp.encode("the snow☃man is") == [*wp.encode("the"), wp.unk_id, *wp.encode("is")]
    assert wp.decode(wp.encode("a 雪 b")) == "a [UNK] b"  # a CJK character is a word of its own


def test_wordpiece_from_str_encodes_as_the_trained_one():
    wp = small()
    again = text.WordPiece.from_str(wp.facts()["tokenizer"])
    sample = text.corpus()[1][:3000]  # test text: words it was not trained on
    assert again.encode(sample) == wp.encode(sample) and again.decode(wp.encode(sample)) == wp.decode(wp.encode(sample))
    assert again.special_ids() == wp.special_ids() and len(again) == len(wp)


def test_wordpiece_training_is_deterministic_within_and_across_processes():
    here = text.WordPiece.train(text.corpus()[0][:30_000], 300).tokenizer.to_str()
    assert here == small().tokenizer.to_str()
    code = ("import hashlib; from common.data import text; print(hashlib.sha256(text.WordPiece.train("
            "text.corpus()[0][:30_000], 300).tokenizer.to_str().encode()).hexdigest())")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    import hashlib

    assert there.stdout.strip() == hashlib.sha256(here.encode()).hexdigest()
