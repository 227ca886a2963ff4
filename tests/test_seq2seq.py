"""Sequence to sequence: the dates data set, decoding (greedy and beam search) and the seq2seq task."""

import datetime
import itertools
import math

import pytest
import torch
import torch.nn as nn

from common import decode
from common.data import dates, get_dataset
from common.data.collate import pad_pairs
from common.tasks import get_task

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`


def test_dates_are_fixed_split_by_date_and_read_back_to_iso():
    train, test = dates.load()
    assert (len(train), len(test)) == (dates.TRAIN_SIZE, dates.TEST_SIZE) >= (20_000, 2_000)
    assert not {t for _, t in train.texts} & {t for _, t in test.texts}  # no test date is a training date
    v = dates.vocab()
    for source, target in train.texts[:200] + test.texts[:200]:
        day = datetime.date.fromisoformat(target)  # the target is the ISO form of a real date
        assert dates.FIRST <= day <= dates.LAST and source in dates.styles(day)
    source_ids, target_ids = train[0]
    text = get_task("seq2seq", dates.facts()).text
    assert text(source_ids) == train.texts[0][0] and text(target_ids) == train.texts[0][1]
    assert int(target_ids[-1]) == dates.EOS
    styles_seen = {dates.styles(datetime.date.fromisoformat(t)).index(s) for s, t in train.texts[:2000]}
    assert len(styles_seen) == dates.NUM_STYLES  # every style is drawn
    assert dates.styles(datetime.date(2015, 3, 3))[:4] == [
        "Tuesday, 3 March 2015", "3 March 2015", "March 3, 2015", "March 3rd, '15"]
    assert v.encode("3 ž") == [v.stoi["3"], v.stoi[" "], dates.UNK]  # a character never seen is <unk>


def test_pairs_pad_sources_and_targets_at_the_end():
    samples = [(torch.tensor([5, 6, 7]), torch.tensor([8, 2])), (torch.tensor([9]), torch.tensor([10, 11, 12, 2]))]
    inputs, targets = pad_pairs(samples, pad_multiple=4)
    assert inputs["src"].tolist() == [[5, 6, 7, 0], [9, 0, 0, 0]] and inputs["src_lengths"].tolist() == [3, 1]
    assert inputs["mask"].tolist() == [[True, True, True, False], [True, False, False, False]]
    assert targets.tolist() == [[8, 2, 0, 0], [10, 11, 12, 2]]
    assert inputs["tgt"].tolist() == [[1, 8, 2, 0], [1, 10, 11, 12]]  # teacher forcing: <s>, then all but the last
    assert get_dataset("dates").collate(4)(samples)[1].tolist() == targets.tolist()


class Markov(nn.Module):
    """A toy seq2seq model: the next token's logits depend on the previous token only (a fixed table),
    plus a per-source offset, so that every sequence's probability is known exactly."""

    def __init__(self, vocab: int = 5, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab, vocab, generator=g) * 2  # (previous, next)
        self.table[:, 0] = -1e9  # never <pad>
        self.table[:, 1] = -1e9  # never <s>

    def encode(self, src, src_lengths):
        return {"offset": src[:, :1].float() * 0.1}  # (B, 1)

    def decode_step(self, memory, tokens, state):
        return self.table[tokens] + memory["offset"], (state or 0) + 1

    def log_prob(self, sequence: list[int], offset: float) -> float:
        previous, total = 1, 0.0
        for token in sequence:
            total += (self.table[previous] + offset).log_softmax(-1)[token].item()
            previous = token
        return total


def brute_force(model: Markov, offset: float, max_len: int, penalty) -> list[int]:
    """The best sequence ending in </s> (id 2) within max_len tokens, or of max_len tokens without it."""
    best, best_score = None, -math.inf
    for n in range(1, max_len + 1):
        for body in itertools.product([3, 4], repeat=n - 1):
            for last in ([2] if n < max_len else [2, 3, 4]):
                sequence = [*body, last]
                score = model.log_prob(sequence, offset) / penalty(len(sequence))
                if score > best_score:
                    best, best_score = sequence, score
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("penalty", [decode.no_penalty, decode.gnmt_penalty(0.6)])
def test_beam_search_finds_the_best_sequence_and_a_beam_of_one_is_greedy(penalty, seed):
    model = Markov(seed=seed)
    src, lengths = torch.tensor([[3, 1], [4, 1], [0, 1]]), torch.tensor([2, 2, 2])
    wide = decode.beam_search(model, src, lengths, max_len=6, bos_id=1, eos_id=2, beam=40, length_penalty=penalty)
    for b, offset in enumerate([0.3, 0.4, 0.0]):
        expected = brute_force(model, offset, 6, penalty)
        assert wide[b, :len(expected)].tolist() == expected and not wide[b, len(expected):].any()
    one = decode.beam_search(model, src, lengths, max_len=6, bos_id=1, eos_id=2, beam=1)
    greedy = decode.greedy(model, src, lengths, max_len=6, bos_id=1, eos_id=2)
    L = max(one.shape[1], greedy.shape[1])
    pad = lambda t: torch.cat([t, t.new_zeros(t.shape[0], L - t.shape[1])], 1)
    assert torch.equal(pad(one), pad(greedy))


def test_the_seq2seq_task_scores_bleu_as_sacrebleu_and_exact_match_and_perplexity():
    sacrebleu = pytest.importorskip("sacrebleu")
    facts = dates.facts()
    task = get_task("seq2seq", facts, label_smoothing=0.1)
    v = dates.vocab()
    references = ["2015-03-03", "1999-12-31", "2001-01-01"]
    hypotheses = ["2015-03-03", "1999-12-13", "2001-01"]
    encode = lambda texts: pad_pairs([(torch.tensor(v.encode(t)), torch.tensor(v.encode(t) + [dates.EOS]))
                                      for t in texts])[1]
    targets, tokens = encode(references), encode(hypotheses)
    logits = torch.randn(*targets.shape, len(v))
    metrics = task.build_metrics(torch.device("cpu"))
    task.update(metrics, {"logits": logits, "tokens": tokens}, targets)
    result = task.compute(metrics)
    expected = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="char").score
    assert result["bleu"] == pytest.approx(expected, abs=1e-4) and 0 < expected < 100
    assert result["exact_match"] == pytest.approx(1 / 3)
    nll = nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=dates.PAD)
    assert result["loss"] == pytest.approx(nll.item(), rel=1e-6)
    assert result["perplexity"] == pytest.approx(math.exp(nll.item()), rel=1e-6)
    # training: label smoothing applies
    smoothed = nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=dates.PAD,
                                           label_smoothing=0.1)
    assert task.loss(logits, targets).item() == pytest.approx(smoothed.item(), rel=1e-6)


# ---------------------------------------------------------------- training, strategies, translating

from common.config import ConfigError, resolve, validate  # noqa: E402
from common.translate import main as translate_main  # noqa: E402
from tests.conftest import (bitwise_equal, interrupted_copy, load_json, made_once, max_difference,  # noqa: E402
                            torchrun_many, weights)
from train import main  # noqa: E402

# a fixed 64 of the test split (--eval-samples): decoding all of it took most of a run's time
FEW_STEPS = ["--max-steps", "6", "--batch-size", "32", "--wandb", "disabled", "--bucketing", "size", "--eval-samples", "64"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A few steps of the Transformer (tied embeddings) and of RNNsearch (recurrent, attention): in one
    process, and under torchrun with 2 processes (fsdp), each ending with an evaluation that decodes."""
    def make(out):
        launches = []  # the two-process runs, in one launch (tests/launch_many.py)
        for paper in ("transformer", "bahdanau"):  # the Transformer without dropout, whose masks differ by rank
            flavor = ["--flavor", "tiny-no-dropout"] if paper == "transformer" else []
            flags = ["--paper", paper, *flavor, *FEW_STEPS, "--results-dir", str(out / "results")]
            assert main(flags + ["--out", str(out / f"{paper}-single")]) == 0
            for strategy in ("fsdp",):  # ddp of the Transformer too until commit 5963eb2 (for the suite's time)
                launches.append(flags + ["--strategy", strategy, "--out", str(out / f"{paper}-{strategy}")])
        torchrun_many(launches, cwd=out)

    return made_once(tmp_path_factory, "seq2seq", make)


@pytest.mark.parametrize("paper, strategy", [("transformer", "fsdp"), ("bahdanau", "fsdp")])
def test_two_processes_train_what_one_process_trains_and_decode_in_step(runs, paper, strategy):
    two, one = runs / f"{paper}-{strategy}", runs / f"{paper}-single"
    assert max_difference(weights(two), weights(one)) < 1e-5
    a, b = load_json(two / "result.json"), load_json(one / "result.json")
    assert a["strategy"] == strategy and a["task"] == "seq2seq" and a["metric"] == "bleu"
    assert set(a["final_metrics"]) == {"bleu", "exact_match", "loss", "perplexity"}
    assert a["final_metrics"]["loss"] == pytest.approx(b["final_metrics"]["loss"], rel=1e-4)
    assert a["final_metrics"]["exact_match"] == pytest.approx(b["final_metrics"]["exact_match"])


def test_a_run_resumed_mid_epoch_equals_an_uninterrupted_one(tmp_path):
    flags = ["--paper", "gru", *FEW_STEPS, "--max-steps", "8", "--ckpt-every", "3", "--keep-ckpts", "5",
             "--results-dir", str(tmp_path / "results")]
    assert main(flags + ["--out", str(tmp_path / "run")]) == 0
    resumed = interrupted_copy(tmp_path / "run", 3, tmp_path / "resumed")
    assert main(["--resume", str(resumed)]) == 0
    assert bitwise_equal(weights(resumed), weights(tmp_path / "run"))


def test_translate_prints_the_output_draws_the_attention_and_reads_unknown_characters(runs, tmp_path, capsys):
    run = runs / "bahdanau-single"
    capsys.readouterr()
    assert translate_main(["--run", str(run), "Tuesday, 3 March 2015", "3 ž 15", "--attention",
                           str(tmp_path / "a.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Tuesday, 3 March 2015 -> ") and lines[2].startswith("3 ž 15 -> ")  # ž is <unk>
    assert (tmp_path / "a-0.png").stat().st_size > 1000 and (tmp_path / "a-1.png").is_file()
    assert translate_main(["--run", str(runs / "transformer-single"), "3/3/15", "--beam", "3"]) == 0
    assert capsys.readouterr().out.startswith("3/3/15 -> ")  # no attention picture from the Transformer


def test_beam_flags_go_with_seq2seq_data_only():
    cfg = resolve({"paper": "transformer", "beam": 4, "length_penalty": 0.6})
    validate(cfg)
    with pytest.raises(ConfigError, match="--beam and --length-penalty decode sequences"):
        validate(resolve({"paper": "lstm", "beam": 4}))
