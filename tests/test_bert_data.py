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


def test_a_text_data_set_reads_with_wordpiece_and_its_tokenizer_decodes_it():
    from common.data import get_dataset

    pydoc = get_dataset("pydoc")
    facts = pydoc.facts(tokenizer="wordpiece", vocab_size=400)
    assert (facts["vocab_size"], facts["level"], facts["mask_id"]) == (400, "wordpiece", 4)
    train, test = pydoc.read(tokenizer="wordpiece", vocab_size=400, block_size=32)
    wp = text.codec(facts)
    assert isinstance(wp, text.WordPiece) and train[0][0].shape == (32,)
    assert wp.decode(train[0][0]).startswith('the " assert " statement')  # pydoc's first topic, uncased
    assert torch.equal(train[0][1][:-1], train[0][0][1:])  # the next token at every position, as char's blocks
    # bits per character count a token's characters: a piece's own, "##" left out, none for [CLS]
    chars = facts["token_chars"]
    assert chars[wp.cls_id] == 0 and chars[wp.unk_id] == 1
    assert [chars[i] for i in wp.encode("statements")] == [len(p.removeprefix("##")) for p in
                                                          wp.tokenizer.encode("statements").tokens]


def test_wordpiece_is_a_tokenizer_choice_and_its_vocabulary_size_applies():
    from common.config import resolve, validate
    from common.errors import ConfigError

    validate(resolve(dict(paper="gpt", tokenizer="wordpiece", vocab_size=200, block_size=32)))  # below BPE's 256
    with pytest.raises(ConfigError, match="--vocab-size sizes a BPE vocabulary; add --tokenizer bpe \\(or "
                                          "--tokenizer wordpiece"):
        validate(resolve(dict(paper="gpt", vocab_size=200)))


def test_prepare_text_writes_wordpiece_shards_with_texts_ids(tmp_path, capsys):
    """Token shards of a WordPiece trained on the whole training text: the ids --dataset text gives, and
    the facts (tokenizer, token_chars) that decode them."""
    import numpy as np

    from common.data import get_dataset, prepare_text

    book = tmp_path / "book.txt"
    book.write_text(text.corpus()[0][:40_000])
    assert prepare_text.main(["--input", str(book), "--tokenizer", "wordpiece", "--vocab-size", "300",
                              "--out", str(tmp_path / "shards")]) == 0
    assert "wordpiece: 300 tokens, trained on" in capsys.readouterr().out
    facts = get_dataset("tokens").facts(data_dir=str(tmp_path / "shards"))
    theirs = get_dataset("text").facts(data_dir=str(book), tokenizer="wordpiece", vocab_size=300)
    assert facts == {k: theirs[k] for k in ("vocab_size", "level", "token_chars", "tokenizer")}
    train_text, test_text = text.corpus(str(book), "text")
    wp = text.codec(facts)
    for split, part in (("train", train_text), ("test", test_text)):
        ids = np.fromfile(tmp_path / "shards" / f"{split}.bin", "uint16")
        assert ids.tolist() == wp.encode(part)


# ---------------------------------------------------------------- masking (Section 3.1, Appendix A.1)

import math  # noqa: E402

import torch  # noqa: E402

from common.data.mlm import IGNORE_INDEX, mask_tokens  # noqa: E402

PAD, UNK, CLS, SEP, MASK = range(5)
SPECIALS = (PAD, UNK, CLS, SEP, MASK)


def batch(B: int, T: int, V: int, seed: int = 0, shortest: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs "[CLS] A [SEP] B [SEP]" of random lengths (shortest to T real tokens), padded with [PAD]:
    ids (B, T) and attention_mask (B, T); a few [UNK] among the ordinary tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    ids[torch.rand(B, T, generator=g) < 0.02] = UNK
    lengths = torch.randint(shortest, T + 1, (B,), generator=g)
    for b, n in enumerate(lengths.tolist()):
        ids[b, 0], ids[b, n // 2], ids[b, n - 1] = CLS, SEP, SEP
        ids[b, n:] = PAD
    return ids, (torch.arange(T) < lengths[:, None]).long()


def tolerance(share: float, n: int, sds: float = 4.5) -> float:
    """4.5 binomial standard deviations of a share over n draws: a correct draw falls outside once in
    about 150,000 seeds (two-sided normal tail), a bias of that size is caught."""
    return sds * math.sqrt(share * (1 - share) / n)


def test_mask_tokens_chooses_15_percent_of_each_sequences_candidates_uniformly():
    ids, attn = batch(512, 256, 1000)
    inputs, labels = mask_tokens(ids, attn, SPECIALS, MASK, 1000, torch.Generator().manual_seed(1))
    candidate = attn.bool() & ~torch.isin(ids, torch.tensor(SPECIALS))
    chosen = labels != IGNORE_INDEX
    n, k = candidate.sum(1), chosen.sum(1)
    # the released code's count: round(0.15 n) in every sequence (so within half a token of 15%), at least one
    assert torch.equal(k, torch.round(0.15 * n.double()).long().clamp(min=1))
    assert abs(k.sum() / n.sum() - 0.15) < 0.5 * len(n) / n.sum()
    # uniform over the candidates: the first and last halves of the positions are chosen as often
    for half in (slice(0, 128), slice(128, 256)):
        share, seen = chosen[:, half].sum() / candidate[:, half].sum(), int(candidate[:, half].sum())
        assert abs(share - 0.15) < tolerance(0.15, seen)


def test_mask_tokens_makes_80_percent_mask_10_random_10_unchanged_and_labels_the_originals():
    V = 1000
    ids, attn = batch(512, 256, V)
    inputs, labels = mask_tokens(ids, attn, SPECIALS, MASK, V, torch.Generator().manual_seed(2))
    chosen = labels != IGNORE_INDEX
    assert torch.equal(labels[chosen], ids[chosen])  # labels: the original ids where chosen, -100 elsewhere
    assert torch.equal(inputs[~chosen], ids[~chosen])  # nothing else changes
    m = int(chosen.sum())
    masked = (inputs[chosen] == MASK).double().mean()
    same = (inputs[chosen] == ids[chosen]).double().mean()
    other = 1 - masked - same
    unchanged = 0.1 + 0.1 / (V - 5)  # kept, or drawn and equal to the original
    assert abs(masked - 0.8) < tolerance(0.8, m)
    assert abs(same - unchanged) < tolerance(unchanged, m)
    assert abs(other - (0.2 - unchanged)) < tolerance(0.2 - unchanged, m)


def test_mask_tokens_never_chooses_specials_or_padding_nor_draws_a_special():
    V = 12  # 7 ordinary tokens: each is drawn many times
    ids, attn = batch(256, 64, V, seed=3)
    before = ids.clone()
    inputs, labels = mask_tokens(ids, attn, SPECIALS, MASK, V, torch.Generator().manual_seed(3))
    assert torch.equal(ids, before)  # the input is not changed in place
    special = torch.isin(ids, torch.tensor(SPECIALS))
    assert (labels[special | (attn == 0)] == IGNORE_INDEX).all()
    assert torch.equal(inputs[special], ids[special])  # [PAD], [UNK], [CLS], [SEP] kept where they are
    replaced = (labels != IGNORE_INDEX) & (inputs != MASK) & (inputs != ids)
    assert set(inputs[replaced].tolist()) == set(range(5, V))  # drawn from the ordinary tokens, all of them


def test_mask_tokens_chooses_at_least_one_in_every_sequence_and_at_most_max_predictions():
    ids, attn = batch(256, 128, 500, seed=4, shortest=4)  # the shortest hold one candidate: round(0.15) = 0
    _, labels = mask_tokens(ids, attn, SPECIALS, MASK, 500, torch.Generator().manual_seed(4))
    n = (attn.bool() & ~torch.isin(ids, torch.tensor(SPECIALS))).sum(1)
    k = (labels != IGNORE_INDEX).sum(1)
    few = (n >= 1) & (n <= 3)  # round(0.15 n) = 0
    assert few.any() and (k[few] == 1).all() and (k[n >= 1] >= 1).all()
    _, capped = mask_tokens(ids, attn, SPECIALS, MASK, 500, torch.Generator().manual_seed(4), max_predictions=5)
    assert (capped != IGNORE_INDEX).sum(1).max() == 5 and ((capped != IGNORE_INDEX).sum(1) == k.clamp(max=5)).all()
    only_specials = torch.tensor([[CLS, SEP, PAD, PAD]])
    _, none = mask_tokens(only_specials, torch.tensor([[1, 1, 0, 0]]), SPECIALS, MASK, 500, torch.Generator())
    assert (none == IGNORE_INDEX).all()  # no candidate: nothing chosen


def test_mask_tokens_is_the_same_for_the_same_generator_state():
    ids, attn = batch(64, 128, 1000, seed=5)
    a = mask_tokens(ids, attn, SPECIALS, MASK, 1000, torch.Generator().manual_seed(7))
    b = mask_tokens(ids, attn, SPECIALS, MASK, 1000, torch.Generator().manual_seed(7))
    c = mask_tokens(ids, attn, SPECIALS, MASK, 1000, torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


# ---------------------------------------------------------------- the masked-LM loss and metrics

from common.tasks import masked_lm_loss, masked_lm_metrics, masked_lm_sums  # noqa: E402


def test_masked_lm_loss_reads_only_the_chosen_positions():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 10, 50, generator=g)
    ids = torch.randint(5, 50, (3, 10), generator=g)
    labels = torch.where(torch.rand(3, 10, generator=g) < 0.3, ids, IGNORE_INDEX)
    chosen = labels != IGNORE_INDEX
    perturbed = logits.clone()
    perturbed[~chosen] = 100 * torch.randn(int((~chosen).sum()), 50, generator=g)
    assert torch.equal(masked_lm_loss(perturbed, labels), masked_lm_loss(logits, labels))
    assert all(torch.equal(a, b) for a, b in zip(masked_lm_sums(perturbed, labels), masked_lm_sums(logits, labels)))
    moved = logits.clone()
    moved[chosen] += 5 * torch.randn(int(chosen.sum()), 50, generator=g)
    assert masked_lm_loss(moved, labels) != masked_lm_loss(logits, labels)  # a chosen position's logits count
    # by hand: uniform logits give log V and perplexity V; an argmax on the label is correct
    uniform = torch.zeros(1, 4, 50)
    uniform[0, 1, 7] = 1e-4  # position 1's argmax is 7
    nll, correct, count = masked_lm_sums(uniform, torch.tensor([[IGNORE_INDEX, 7, 8, IGNORE_INDEX]]))
    metrics = masked_lm_metrics(float(nll), float(correct), float(count))
    assert count == 2 and correct == 1 and metrics["mlm_accuracy"] == 0.5
    assert metrics["loss"] == pytest.approx(math.log(50), rel=1e-4) and metrics["perplexity"] == pytest.approx(50, rel=1e-3)


def test_masked_lm_sums_of_a_padded_batch_are_those_of_its_sequences_alone():
    g = torch.Generator().manual_seed(1)
    lengths, T, V = (5, 9), 9, 30
    alone = []
    for n in lengths:
        logits = torch.randn(1, n, V, generator=g)
        labels = torch.randint(5, V, (1, n), generator=g)
        labels[0, ::2] = IGNORE_INDEX  # not chosen
        alone.append((logits, labels))
    logits = torch.randn(2, T, V, generator=g)  # padding's logits: anything
    labels = torch.full((2, T), IGNORE_INDEX)
    for b, ((l, y), n) in enumerate(zip(alone, lengths)):
        logits[b, :n], labels[b, :n] = l[0], y[0]
    together = masked_lm_sums(logits, labels)
    summed = [sum(parts) for parts in zip(*(masked_lm_sums(l, y) for l, y in alone))]
    assert torch.allclose(together[0], summed[0]) and together[1:] == tuple(summed[1:])
    # the loss weighs every chosen token the same: not the mean of the two sequences' means
    assert torch.allclose(masked_lm_loss(logits, labels), summed[0] / summed[2])
    means = torch.stack([masked_lm_loss(l, y) for l, y in alone]).mean()
    assert not torch.allclose(masked_lm_loss(logits, labels), means)
