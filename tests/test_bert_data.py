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
import torch.nn.functional as F  # noqa: E402

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


# ---------------------------------------------------------------- the pre-training pairs (Section 3.1, Appendix A.2)

from common.config import parse_model_kwargs, resolve, validate  # noqa: E402
from common.data import get_dataset, sentence_pairs  # noqa: E402
from common.errors import ConfigError  # noqa: E402
from common.tasks import get_task  # noqa: E402

PAIRS, SEGMENTS = get_dataset("pydoc-pairs"), get_dataset("pydoc-segments")


@lru_cache(maxsize=2)
def pydoc_pairs(nsp: bool = True):
    return (PAIRS if nsp else SEGMENTS).read(tokenizer="wordpiece")


def joined(ids) -> str:
    """Token ids as a string in which a contiguous run of ids is a substring."""
    return "," + ",".join(map(str, ids)) + ","


def test_a_sample_is_cls_a_sep_b_sep_with_its_segments_and_fits_the_block():
    train, test = pydoc_pairs()
    wp = train.wp
    for data in (train, test):
        for k in range(0, len(data), 7):
            ids, segments = data.ids[k], data.segments[k]
            sep = (ids == wp.sep_id).nonzero()[:, 0]
            assert ids[0] == wp.cls_id and (ids == wp.cls_id).sum() == 1 and len(sep) == 2 and sep[1] == len(ids) - 1
            assert sep[0] > 1 and sep[1] > sep[0] + 1  # A and B hold a token each at least
            assert torch.equal(segments, (torch.arange(len(ids)) > sep[0]).long())  # 0 to the first [SEP], then 1
            assert len(ids) <= 128 and data.sizes[k] == len(ids)
    assert max(train.sizes) == 128 and len(set(train.sizes)) > 50  # lengths vary (documents end, shorter targets)
    assert len(train) > 5000 and len(test) > 500


def test_is_next_b_follows_a_in_its_document_and_not_next_b_comes_from_another():
    samples, wp = sentence_pairs.pairs_of("train", 128, None, True)
    documents = []
    for document in sentence_pairs.pydoc_documents("train"):
        ids = wp.tokenizer.encode_batch(sentence_pairs.sentences(document), add_special_tokens=False)
        documents.append(joined([t for e in ids for t in e.ids]))
    labels = torch.tensor([label for _, _, label in samples])
    share = (labels == sentence_pairs.NOT_NEXT).double().mean()
    assert 0.5 <= share < 0.6  # half, and a chunk of one sentence always takes a random B (the released code's)
    checked = {sentence_pairs.IS_NEXT: 0, sentence_pairs.NOT_NEXT: 0}
    for a, b, label in samples[::10]:
        if len(a) < 20 or len(b) < 20:  # short runs of tokens may stand anywhere
            continue
        home = [d for d in documents if joined(a) in d]
        assert home, "A is a contiguous run of one document"
        after = [d.index(joined(a)) + len(joined(a)) - 1 for d in home]  # where A ends, as a string offset
        follows = any(0 <= d.find(joined(b)[:-1]) - end <= len(joined(a)) + len(joined(b))
                      for d, end in zip(home, after))  # B within the tokens truncation took between them
        assert follows == (label == sentence_pairs.IS_NEXT), (wp.decode(a), wp.decode(b), label)
        checked[label] += 1
    assert min(checked.values()) > 50


def test_single_segments_have_no_b_no_nsp_label_and_build_bert_without_its_nsp_head():
    train, _ = pydoc_pairs(nsp=False)
    wp = train.wp
    for k in range(0, len(train), 11):
        x, y = train[k]
        assert train.ids[k][0] == wp.cls_id and (train.ids[k] == wp.sep_id).nonzero()[:, 0].tolist() == [
            len(train.ids[k]) - 1]
        assert not x["segments"].any() and set(y) == {"labels"}
    assert SEGMENTS.facts(tokenizer="wordpiece")["nsp"] is False and PAIRS.facts(tokenizer="wordpiece")["nsp"] is True
    from papers import get_paper

    bert = get_paper("bert")
    assert bert.build_for_data("tiny", SEGMENTS.facts(tokenizer="wordpiece")).nsp_head is None
    assert bert.build_for_data("tiny", PAIRS.facts(tokenizer="wordpiece")).nsp_head is not None


def test_masks_are_drawn_once_per_sample_from_its_index_alike_in_every_process():
    train, test = pydoc_pairs()
    wp = train.wp
    x, y = train[5]
    again, _ = train[5]
    assert torch.equal(x["idx"], again["idx"])  # static: the same masks whenever the sample is read
    chosen = y["labels"] != IGNORE_INDEX
    n = int((~torch.isin(train.ids[5], torch.tensor(wp.special_ids()))).sum())
    assert int(chosen.sum()) == max(1, round(0.15 * n))  # 15% of its tokens, as mask_tokens chooses them
    assert torch.equal(y["labels"][chosen], train.ids[5][chosen]) and torch.equal(x["segments"], train.segments[5])
    assert not torch.equal(train[6][1]["labels"] != IGNORE_INDEX, train[5][1]["labels"] != IGNORE_INDEX)
    import hashlib

    def digest(data) -> str:
        return hashlib.sha256(b"".join(torch.cat([data[k][0]["idx"], data[k][1]["labels"]]).numpy().tobytes()
                                       for k in range(0, len(data), 50))).hexdigest()

    code = ("import hashlib, torch; from common.data import get_dataset; train, _ = get_dataset('pydoc-pairs').read("
            "tokenizer='wordpiece'); print(hashlib.sha256(b''.join(torch.cat([train[k][0]['idx'], train[k][1]["
            "'labels']]).numpy().tobytes() for k in range(0, len(train), 50))).hexdigest())")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert there.stdout.strip() == digest(train)


def test_a_batch_is_padded_at_the_end_with_pad_no_label_and_a_mask():
    train, _ = pydoc_pairs()
    picked = [train[k] for k in range(40) if train.sizes[k] < 128][:3] + [train[train.sizes.index(128)]]
    inputs, targets = PAIRS.collate(pad_multiple=8)(picked)
    assert inputs["idx"].shape == inputs["segments"].shape == inputs["mask"].shape == targets["labels"].shape == (4, 128)
    for b, (x, y) in enumerate(picked):
        n = len(x["idx"])
        assert torch.equal(inputs["idx"][b, :n], x["idx"]) and torch.equal(targets["labels"][b, :n], y["labels"])
        assert inputs["mask"][b].sum() == n and not inputs["mask"][b, n:].any()
        assert (inputs["idx"][b, n:] == 0).all() and (inputs["segments"][b, n:] == 0).all()  # [PAD], segment A
        assert (targets["labels"][b, n:] == IGNORE_INDEX).all()
    assert targets["next_sentence_label"].tolist() == [int(y["next_sentence_label"]) for _, y in picked]
    assert SEGMENTS.collate()([pydoc_pairs(False)[0][0]])[1].keys() == {"labels"}


@pytest.mark.parametrize("flags, words", [
    (["--tokenizer", "char"], "--dataset pydoc-pairs is read in WordPiece tokens .*; use --tokenizer wordpiece, not char"),
    (["--dataset", "pydoc-segments", "--tokenizer", "bpe"], "--dataset pydoc-segments is read in WordPiece tokens"),
    (["--dataset", "pydoc-ltr", "--tokenizer", "bpe"], "--dataset pydoc-ltr is read in WordPiece tokens"),
    (["--model-kwargs", "nsp=False"], "--model-kwargs nsp: BERT takes nsp from the data set"),
    (["--dataset", "pydoc-ltr", "--model-kwargs", "causal=False"], "--model-kwargs causal: BERT takes causal from the "
                                                                   "data set"),
])
def test_what_the_pairs_refuse_is_one_error(flags, words):
    values = {k.lstrip("-").replace("-", "_"): v for k, v in zip(flags[::2], flags[1::2])}
    if "model_kwargs" in values:
        values["model_kwargs"] = parse_model_kwargs([values["model_kwargs"]])
    with pytest.raises(ConfigError, match=words):
        validate(resolve(dict(paper="bert") | values))


# ---------------------------------------------------------------- the masked-LM task kind

def bert_and_batch(n: int = 6, seed: int = 0):
    from papers.bert.model import BERT, FLAVORS

    train, _ = pydoc_pairs()
    torch.manual_seed(seed)
    model = BERT(**FLAVORS["tiny"] | dict(vocab_size=len(train.wp))).eval()
    lengths = sorted(set(train.sizes))
    picked = [train[train.sizes.index(length)] for length in lengths[:: len(lengths) // n][:n]]  # n lengths
    return model, picked


def test_the_loss_is_the_masked_lms_over_the_chosen_tokens_plus_nsps():
    model, picked = bert_and_batch()
    inputs, targets = PAIRS.collate()(picked)
    task = get_task("masked-lm", PAIRS.facts(tokenizer="wordpiece"))
    with torch.no_grad():
        mlm, nsp = task.forward(model, inputs, targets)
        chosen = targets["labels"] != IGNORE_INDEX
        by_hand = (F.cross_entropy(mlm[chosen], targets["labels"][chosen])
                   + F.cross_entropy(nsp, targets["next_sentence_label"]))
        assert abs(task.loss((mlm, nsp), targets) - by_hand) < 1e-5
        assert abs(task.loss((mlm, None), targets) - F.cross_entropy(mlm[chosen], targets["labels"][chosen])) < 1e-5
        no_label = {"labels": targets["labels"]}  # single segments
        assert abs(task.loss((mlm, nsp), no_label) - task.loss((mlm, None), targets)) < 1e-6
        hits, count = task.train_counts((mlm, nsp), targets).tolist()
        assert count == chosen.sum() and hits == (mlm.argmax(-1) == targets["labels"])[chosen].sum()


def test_a_padded_batch_sums_to_the_scores_of_its_sequences_one_at_a_time():
    """The masked LM's summed negative log-likelihood, correct predictions and count, and NSP's, of a padded
    batch of six lengths through BERT: those of its samples run alone, unpadded."""
    from common.metrics import Metrics

    model, picked = bert_and_batch()
    task = get_task("masked-lm", PAIRS.facts(tokenizer="wordpiece"))
    together, alone = Metrics(task.metrics()), Metrics(task.metrics())
    inputs, targets = PAIRS.collate(pad_multiple=64)(picked)
    assert len({int(m.sum()) for m in inputs["mask"]}) == 6 and not inputs["mask"].all()
    with torch.no_grad():
        task.update(together, task.forward(model, inputs, targets), targets)
        for sample in picked:
            x, y = PAIRS.collate()([sample])
            assert x["mask"].all()  # alone: no padding
            task.update(alone, task.forward(model, x, y), y)
    a, b = together.compute(), alone.compute()
    assert a["count"] == b["count"] > 50 and a["correct"] == b["correct"]
    assert abs(a["nll"] - b["nll"]) < 1e-4 * b["nll"] and a["nll"] > 100
    scores = task.compute(together)
    assert scores.keys() == {"loss", "mlm_accuracy", "perplexity", "mlm_loss", "nsp_accuracy", "nsp_loss"}
    assert abs(scores["mlm_loss"] - a["nll"] / a["count"]) < 1e-9 and abs(scores["perplexity"] - math.exp(
        scores["mlm_loss"])) < 1e-6 and abs(scores["loss"] - scores["mlm_loss"] - scores["nsp_loss"]) < 1e-9
    assert task.compute(alone)["nsp_accuracy"] == scores["nsp_accuracy"]
    model.nsp_head = None  # a model without NSP (on single segments): no NSP scores
    none = Metrics(task.metrics())
    with torch.no_grad():
        task.update(none, task.forward(model, inputs, targets), targets)
    assert task.compute(none).keys() == {"loss", "mlm_accuracy", "perplexity"}


# ---------------------------------------------------------------- the left-to-right LM (Section 5.1, "LTR & No NSP")

LTR = get_dataset("pydoc-ltr")


def test_ltr_labels_are_the_unmasked_inputs_shifted_by_one():
    """pydoc-segments' samples unmasked; position t labelled with token t + 1, the last one ([SEP]) and padding
    with nothing; the data builds bert left-only and without NSP."""
    train, test = LTR.read(tokenizer="wordpiece")
    segments, _ = pydoc_pairs(False)
    assert (len(train), len(test)) == (len(segments), len(pydoc_pairs(False)[1]))
    for k in range(0, len(train), 97):
        x, y = train[k]
        assert torch.equal(x["idx"], segments.ids[k]) and x["idx"][-1] == train.wp.sep_id  # no [MASK]: unmasked
        assert torch.equal(y["labels"][:-1], x["idx"][1:]) and y["labels"][-1] == IGNORE_INDEX
    inputs, targets = LTR.collate()([train[0], train[1]])
    n = int(inputs["mask"][1].sum())
    assert (targets["labels"][1, n - 1:] == IGNORE_INDEX).all() and torch.equal(targets["labels"][1, :n - 1],
                                                                               inputs["idx"][1, 1:n])
    facts = LTR.facts(tokenizer="wordpiece")
    assert (facts["causal"], facts["nsp"]) == (True, False)
    assert not PAIRS.facts(tokenizer="wordpiece")["causal"] and not SEGMENTS.facts(tokenizer="wordpiece")["causal"]


def test_a_causal_berts_loss_at_t_reads_no_token_after_t():
    """Built for pydoc-ltr, bert's next-token loss at each position is unchanged when every input token after it
    changes; built for pydoc-segments (bidirectional), it changes. The masked-LM task scores every real
    position but the last."""
    from papers.bert import PAPER

    x, y = LTR.collate()([LTR.read(tokenizer="wordpiece")[0][k] for k in (0, 5)])
    t = 10
    later = dict(x, idx=x["idx"].clone())
    later["idx"][:, t + 1:] = torch.where(x["mask"][:, t + 1:], (x["idx"][:, t + 1:] + 7) % 1024, 0)
    losses = {}
    for data in (LTR, SEGMENTS):
        torch.manual_seed(0)
        model = PAPER.build_for_data("tiny", data.facts(tokenizer="wordpiece")).eval()
        assert model.causal == (data is LTR) and model.nsp_head is None
        with torch.no_grad():
            loss = [F.cross_entropy(model(**inputs)[0].transpose(1, 2), y["labels"], reduction="none")
                    for inputs in (x, later)]  # (B, T) each
        losses[data.name] = (loss[0][:, :t + 1] - loss[1][:, :t + 1]).abs().max()
    assert losses["pydoc-ltr"] < 1e-6 and losses["pydoc-segments"] > 1e-4  # untrained: 7e-4
    task = get_task("masked-lm", LTR.facts(tokenizer="wordpiece"))
    with torch.no_grad():
        _, count = task.train_counts(task.forward(model, x, y), y).tolist()
    assert count == x["mask"].sum() - 2  # every real position but each sample's last
