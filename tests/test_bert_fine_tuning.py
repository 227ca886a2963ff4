"""BERT's runs: pre-training through train.py (resumed, it trains the weights it would have trained), and
fine-tuning (Section 3.2): pydoc-topics in WordPiece ("[CLS] passage [SEP]", the pre-training's tokens), and
`--init RUN_DIR`, which starts the classifier from a pre-training run's body (the new W left new)."""

import json

import pytest
import torch

from common.data import get_dataset, text
from common.pretrained import build_model, load_from_run
from papers.bert import PAPER
from tests.conftest import bitwise_equal, interrupted_copy, made_once, max_difference, refused, weights

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

TOPICS = get_dataset("pydoc-topics")
QUICK = ["--batch-size", "16", "--eval-samples", "64"]  # a fixed 64 of the test split: each run evaluates


def train(argv: list[str]) -> int:
    from train import main

    return main(argv + ["--wandb", "disabled"])


# ------------------------------------------------------------------ pre-training


def test_a_resumed_pre_training_run_is_bitwise_the_uninterrupted_one(tmp_path):
    """The masks are the data's (drawn once per sample), the batches the sampler's, dropout the checkpoint's
    RNG: resumed after step 3 of 6, the run ends with the same weights to the bit."""
    flags = ["--paper", "bert", "--max-steps", "6", "--ckpt-every", "3", *QUICK, "--results-dir",
             str(tmp_path / "results")]
    assert train(flags + ["--out", str(tmp_path / "run")]) == 0
    resumed = interrupted_copy(tmp_path / "run", 3, tmp_path / "resumed")
    assert train(["--resume", str(resumed)]) == 0
    assert bitwise_equal(weights(resumed), weights(tmp_path / "run"))
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["final_metrics"].keys() >= {"mlm_accuracy", "perplexity", "nsp_accuracy", "loss"}


# ------------------------------------------------------------------ the fine-tuning data


def test_wordpiece_passages_are_cls_text_sep_in_the_pre_trainings_tokens():
    train_set, test_set = TOPICS.read(tokenizer="wordpiece", block_size=32)
    assert (len(train_set), len(test_set)) == (384, 256)
    facts = TOPICS.facts(tokenizer="wordpiece")
    wp = text.codec(facts)
    x, _ = train_set[0]
    assert x.shape == (32,) and x[0] == wp.cls_id and x[-1] == wp.sep_id
    assert not torch.isin(x[1:-1], torch.tensor(wp.special_ids())).any()
    assert wp.decode(x).startswith("[CLS] assignment statements")  # the first topic's first 30 tokens
    assert facts["tokenizer"] == get_dataset("pydoc-pairs").facts(tokenizer="wordpiece")["tokenizer"]
    with pytest.raises(Exception, match=r"topic assignment holds \d+ passages of 128 tokens"):
        TOPICS.read(tokenizer="wordpiece")  # 128 WordPiece tokens: too few passages a topic


# ------------------------------------------------------------------ --init RUN_DIR


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """BERT tiny, 2 steps on pydoc-pairs and on pydoc-segments (No NSP): finished runs to start from. Seed 1:
    their weights are not those a classifier of seed 0 starts with."""
    def make(folder):
        for name, data in (("run", "pydoc-pairs"), ("no-nsp", "pydoc-segments")):
            assert train(["--paper", "bert", "--dataset", data, "--max-steps", "2", "--seed", "1", *QUICK,
                          "--out", str(folder / name), "--results-dir", str(folder / "results")]) == 0

    folder = made_once(tmp_path_factory, "bert-pretrained-2-steps", make)
    return folder / "run", folder / "no-nsp"


CLASSIFIER = PAPER.for_flavor("tiny-classifier")
HEADS = ["mlm.bias", "mlm.dense.bias", "mlm.dense.weight", "mlm.norm.bias", "mlm.norm.weight", "nsp_head.bias",
         "nsp_head.weight"]


def test_load_run_loads_exactly_the_body_and_leaves_w_new(pretrained):
    run, no_nsp = pretrained
    facts = TOPICS.facts(tokenizer="wordpiece")
    torch.manual_seed(0)
    model = build_model(CLASSIFIER, "tiny-classifier", str(run), facts)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    notes = load_from_run(model, PAPER, str(run))
    assert notes == [f"--init {run}: 31 tensors loaded from {run / 'model.safetensors'}; left new: W.weight, W.bias; "
                     f"not used from the file: {', '.join(HEADS)}"]  # the pre-training heads stay behind
    pre, now = weights(run), model.state_dict()
    body = set(now) - {"W.weight", "W.bias"}
    assert body == set(pre) - set(HEADS) and all(torch.equal(now[k], pre[k]) for k in body)
    assert not any(torch.equal(before[k], pre[k]) for k in body if k.endswith("weight") and "norm" not in k)
    assert torch.equal(now["W.weight"], before["W.weight"]) and not now["W.bias"].any()
    # pre-trained without NSP there is no pooler (nothing trained it): the classifier's starts new
    torch.manual_seed(0)
    model = build_model(CLASSIFIER, "tiny-classifier", str(no_nsp), facts)
    [note] = load_from_run(model, PAPER, str(no_nsp))
    assert "29 tensors loaded" in note and "left new: pooler.weight, pooler.bias, W.weight, W.bias" in note


def test_fine_tuning_through_train_py_starts_from_the_pre_trained_body(pretrained, tmp_path, capsys):
    """One step at lr 1e-12 moves nothing: the fine-tuned run's weights are the pre-trained body and the seeded
    new W; without --init the body is a fresh one."""
    run, _ = pretrained
    common = ["--paper", "bert", "--flavor", "tiny-classifier", "--max-steps", "1", "--lr", "1e-12",
              "--results-dir", str(tmp_path / "results")]
    assert train(common + ["--init", str(run), "--out", str(tmp_path / "tuned")]) == 0
    assert f"--init {run}: 31 tensors loaded from" in capsys.readouterr().out
    tuned, pre = weights(tmp_path / "tuned"), weights(run)
    body = [k for k in tuned if k not in ("W.weight", "W.bias")]
    assert max_difference({k: tuned[k] for k in body}, {k: pre[k] for k in body}) < 1e-8
    torch.manual_seed(0)  # the trainer seeds --seed 0 before it builds the model
    fresh = PAPER.build_for_data("tiny-classifier", TOPICS.facts(tokenizer="wordpiece"))
    assert (tuned["W.weight"] - fresh.W.weight).abs().max() < 1e-8
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert (config["dataset"], config["tokenizer"], config["block_size"]) == ("pydoc-topics", "wordpiece", 32)
    assert train(common + ["--out", str(tmp_path / "scratch")]) == 0
    scratch = weights(tmp_path / "scratch")
    assert max_difference({k: scratch[k] for k in body}, {k: pre[k] for k in body}) > 0.01


def test_a_run_of_other_tokens_is_refused(pretrained, capsys):
    run, _ = pretrained
    line = refused(capsys, ["--paper", "bert", "--flavor", "tiny-classifier", "--init", str(run), "--vocab-size",
                            "512"])
    assert line.startswith(f"train.py: error: --init {run}: the run read other tokens (pydoc-pairs, --tokenizer "
                           f"wordpiece, 1024 of them) than this data set's (512)")


# ------------------------------------------------------------------ "LTR & No NSP" (Section 5.1)


@pytest.fixture(scope="module")
def ltr_run(tmp_path_factory):
    """BERT tiny, 2 steps on pydoc-ltr: a left-to-right run to fine-tune."""
    def make(folder):
        assert train(["--paper", "bert", "--dataset", "pydoc-ltr", "--max-steps", "2", "--seed", "1", *QUICK,
                      "--out", str(folder / "run"), "--results-dir", str(folder / "results")]) == 0

    return made_once(tmp_path_factory, "bert-ltr-2-steps", make) / "run"


def test_fine_tuning_an_ltr_run_keeps_it_left_only_and_an_mlm_run_bidirectional(ltr_run, pretrained, tmp_path,
                                                                                capsys):
    """"The left-only constraint was also applied at fine-tuning": --init of a pydoc-ltr run, with no other flag,
    builds the classifier causal and records it in the run's config (a resume or an export builds it so too);
    --init of a masked-LM run leaves the classifier as it was. Asking for bidirectional is one line."""
    from common.config import resolve

    run, _ = pretrained
    flags = ["--paper", "bert", "--flavor", "tiny-classifier", "--max-steps", "1", "--eval-samples", "64",
             "--results-dir", str(tmp_path / "results")]
    for init, causal in ((ltr_run, True), (run, False)):
        assert train(flags + ["--init", str(init), "--out", str(tmp_path / init.parent.name)]) == 0
        config = json.loads((tmp_path / init.parent.name / "config.json").read_text())
        assert config["model_kwargs"] == ({"causal": True} if causal else {})
        model = build_model(CLASSIFIER, "tiny-classifier", str(init), TOPICS.facts(tokenizer="wordpiece"),
                            config["model_kwargs"])
        assert model.causal == causal
    assert resolve(dict(paper="bert", flavor="tiny-classifier", init=str(ltr_run))).model_kwargs == {"causal": True}
    line = refused(capsys, flags + ["--init", str(ltr_run), "--model-kwargs", "causal=False"])
    assert line == (f"train.py: error: --model-kwargs causal=False: the model of --init {ltr_run} was built with "
                    f"causal=True (its data set, pydoc-ltr); fine-tuning keeps it")
