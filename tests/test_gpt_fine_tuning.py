"""GPT's fine-tuning (Section 3.2) and what its claim "pre-training helps" stands on: the pydoc-topics data set
(passages of pydoc labelled by topic), the classifier's head and auxiliary language-modelling loss against
the same quantities computed by hand, and `--init RUN_DIR`, which starts the classifier from a pre-trained
GPT run's weights (the body loaded, the new head left new) or refuses in one line."""

import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from common.config import TrainConfig, validate
from common.data import get_dataset, text
from common.pretrained import build_model, load_from_run
from common.tasks import get_task
from papers.gpt import PAPER
from papers.gpt.model import GPT, GPTClassifier
from tests.conftest import made_once, max_difference, refused, weights

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

TOPICS = get_dataset("pydoc-topics")
CLASSES = len(text.TOPIC_CLASSES)


def passages_text(split) -> list[str]:
    vocab = text.codec(TOPICS.facts())
    return [vocab.decode(x) for x, _ in split]


# ------------------------------------------------------------------ the data set


def test_topics_are_small_balanced_fixed_and_in_the_pretraining_vocabulary():
    train, test = TOPICS.read()
    assert (len(train), len(test)) == (CLASSES * text.TOPIC_TRAIN, CLASSES * text.TOPIC_TEST) == (384, 256)
    x, y = train[0]
    assert x.shape == (128,) and x.dtype == torch.int64 and y.dtype == torch.int64 and y.ndim == 0
    for split, each in ((train, text.TOPIC_TRAIN), (test, text.TOPIC_TEST)):
        labels = torch.stack([y for _, y in split])
        assert labels.bincount(minlength=CLASSES).tolist() == [each] * CLASSES
    again = TOPICS.read()
    assert all(torch.equal(a.tensors[i], b.tensors[i]) for a, b in zip((train, test), again) for i in (0, 1))
    facts, pydoc = TOPICS.facts(), get_dataset("pydoc").facts()
    assert facts["num_classes"] == CLASSES and facts["classes"] == list(text.TOPIC_CLASSES)
    assert facts["vocab_size"] == pydoc["vocab_size"] and facts["itos"] == pydoc["itos"]  # a pydoc model's W_e fits
    assert TOPICS.task == "classification" and TOPICS.inputs == "tokens"


def test_labels_name_the_topic_a_passage_comes_from():
    """By hand: the first training passage is assignment's title; training passage 148 is the debugger's
    fifth (characters 512 to 640 of its text, the fourth class's: 3 x 48 + 4); test passage 96 is the
    debugger's first test passage (3 x 32), the 32nd from the end of its text."""
    from pydoc_data.topics import topics

    train, test = TOPICS.read()
    train_text, test_text = passages_text(train), passages_text(test)
    assert train_text[0].startswith("Assignment statements\n*********************\n") and int(train[0][1]) == 0
    assert text.TOPIC_CLASSES[3] == "debugger" and int(train[148][1]) == 3
    assert train_text[148] == topics["debugger"].strip()[512:640]
    assert "The debugger is extensible" in train_text[148]
    debugger = topics["debugger"].strip()
    n = len(debugger) // 128
    assert int(test[96][1]) == 3 and test_text[96] == debugger[(n - 32) * 128: (n - 31) * 128]
    assert "whatis expression" in test_text[96]


def test_test_passages_are_disjoint_from_training_and_from_other_topics():
    from pydoc_data.topics import topics

    train, test = TOPICS.read()
    train_text, test_text = passages_text(train), passages_text(test)
    labels = [int(y) for _, y in train] + [int(y) for _, y in test]
    assert len(set(train_text + test_text)) == len(train_text) + len(test_text)  # no passage twice
    for c, name in enumerate(text.TOPIC_CLASSES):
        seen = "".join(t for t, y in zip(train_text, labels) if y == c)
        assert not any(t in seen for t, y in zip(test_text, labels[len(train_text):]) if y == c)
    for t, y in zip(train_text + test_text, labels):  # a label is never ambiguous: no other class holds it
        assert t in topics[text.TOPIC_CLASSES[y]]
        assert not any(t in topics[name] for c, name in enumerate(text.TOPIC_CLASSES) if c != y)


def test_every_passage_is_in_pydocs_training_split_none_in_its_test_split():
    """What the pre-training read: every passage, training and test, as unlabelled text; its test split none."""
    pre_train, pre_test = text.pydoc_corpus()
    train, test = TOPICS.read()
    for t in passages_text(train) + passages_text(test):
        assert t in pre_train and t not in pre_test


def test_pydoc_rest_holds_no_text_of_the_eight_topics_and_pydocs_ids():
    """pydoc-rest, the pre-training text of the claim: no window of 128 characters of any of the eight topics
    (so no passage, training or test) in its training text, nor in its test text (pydoc's); every other
    training topic of pydoc in it; pydoc's vocabulary, so that its model's W_e fits pydoc-topics."""
    from pydoc_data.topics import topics

    rest_train, rest_test = text.pydoc_rest_corpus()
    assert rest_test == text.pydoc_corpus()[1]
    eight = {topics[name].strip()[i: i + 128] for name in text.TOPIC_CLASSES
             for i in range(len(topics[name].strip()) - 127)}
    assert not any(rest[i: i + 128] in eight for rest in (rest_train, rest_test) for i in range(len(rest) - 127))
    kept = [name for name in text.pydoc_split()[0] if name not in text.REST_HELD_OUT]
    assert rest_train == "\n\n".join(topics[name].strip() for name in kept) and 200_000 < len(rest_train) < 210_000
    rest = get_dataset("pydoc-rest")
    assert rest.task == "language-modeling" and rest.facts()["itos"] == TOPICS.facts()["itos"]
    train, test = rest.read()
    vocab = text.codec(rest.facts())
    assert vocab.decode(train[0][0]) == rest_train[:128] and len(test) == len(get_dataset("pydoc").read()[1])


def test_bpe_passages_and_a_block_too_long_for_a_topic():
    train, test = TOPICS.read(tokenizer="bpe", block_size=32)
    assert (len(train), len(test)) == (384, 256) and train[0][0].shape == (32,)
    assert TOPICS.facts(tokenizer="bpe")["tokenizer"] == get_dataset("pydoc").facts(tokenizer="bpe")["tokenizer"]
    with pytest.raises(Exception, match=r"topic assignment holds \d+ passages of 128 tokens, fewer than the 48 \+ 32"):
        TOPICS.read(tokenizer="bpe")


# ------------------------------------------------------------------ the classifier


def small(**kwargs) -> GPTClassifier:
    torch.manual_seed(0)
    model = GPTClassifier(num_classes=5, vocab_size=31, block_size=16, n_layer=2, n_head=2, n_embd=24, **kwargs)
    with torch.no_grad():  # every weight off its initial value (LayerNorms, W_y's zero bias): mistakes show
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def test_the_head_reads_the_last_tokens_final_hidden_state():
    model = small().eval()
    idx = torch.randint(0, 31, (3, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        h = model.embed(idx)  # by hand: h_0, the blocks, the final norm, position m = T - 1, W_y
        for block in model.blocks:
            h = block(h)[0]
        h_m = model.norm(h)[:, -1]  # (B, d)
        expected = h_m @ model.W_y.weight.T + model.W_y.bias
        got = model(idx)
        assert got.shape == (3, 5) and (got - expected).abs().max() < 1e-5
        first = model.norm(h)[:, 0] @ model.W_y.weight.T + model.W_y.bias  # not another position's
        assert (got - first).abs().max() > 1e-2
        changed = idx.clone()
        changed[:, 0] = (idx[:, 0] + 1) % 31  # the last position attends to the whole passage
        assert (model(changed) - got).abs().max() > 1e-4


def test_the_body_is_gpts_by_name_and_the_head_is_new():
    model, gpt = small(), GPT(vocab_size=31, block_size=16, n_layer=2, n_head=2, n_embd=24)
    body = {k: v.shape for k, v in gpt.state_dict().items()}
    own = {k: v.shape for k, v in model.state_dict().items()}
    assert own.keys() - body.keys() == {"W_y.weight", "W_y.bias"} and all(own[k] == s for k, s in body.items())
    torch.manual_seed(0)
    fresh = PAPER.build_for_data("tiny-classifier", {"vocab_size": 104, "num_classes": 8})
    assert fresh.W_y.weight.shape == (8, 128) and not fresh.W_y.bias.any()
    assert abs(fresh.W_y.weight.std().item() - 0.02) < 0.005  # N(0, 0.02), as every weight
    assert PAPER.for_flavor("tiny-classifier").task == "classification"


def test_the_auxiliary_loss_is_half_the_language_models_loss_on_the_same_passages():
    model = small().train()  # no dropout: training and eval forwards agree
    idx = torch.randint(0, 31, (4, 12), generator=torch.Generator().manual_seed(2))
    y = torch.tensor([0, 3, 4, 1])
    out = model(idx)
    (L_1, weight), = out["aux_losses"]
    lm_logits = GPT.forward(model, idx)  # (B, T, V): the language model's own next-token logits
    expected_L_1 = F.cross_entropy(lm_logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten())
    assert weight == 0.5 and abs(L_1.item() - expected_L_1.item()) < 1e-6 and L_1.item() > 1.0
    task = get_task("classification", {"num_classes": 5})
    L_2 = F.cross_entropy(model.eval()(idx), y)
    assert abs(task.loss(out, y).item() - (L_2.item() + 0.5 * expected_L_1.item())) < 1e-5
    assert (out["logits"] - model(idx)).abs().max() < 1e-6
    without = small(lm_weight=0.0).train()  # lambda 0: the classification loss alone
    assert isinstance(without(idx), torch.Tensor)
    assert abs(task.loss(without(idx), y).item() - F.cross_entropy(without(idx), y).item()) < 1e-6


# ------------------------------------------------------------------ --init RUN_DIR


def train(argv: list[str]) -> int:
    from train import main

    return main(argv + ["--wandb", "disabled"])


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """GPT tiny, 2 steps on pydoc: a finished run to start from. Seed 1: its weights are not those a
    classifier of seed 0 starts with (GPT's, drawn first, from the same seed, before W_y)."""
    def make(folder):
        assert train(["--paper", "gpt", "--max-steps", "2", "--seed", "1", "--out", str(folder / "run"),
                      "--results-dir", str(folder / "results")]) == 0

    return made_once(tmp_path_factory, "gpt-pretrained-2-steps", make) / "run"


def classifier_facts() -> dict:
    return TOPICS.facts()


def test_load_run_loads_exactly_the_body_and_leaves_the_head_new(pretrained):
    torch.manual_seed(0)
    model = build_model(PAPER.for_flavor("tiny-classifier"), "tiny-classifier", str(pretrained), classifier_facts())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    notes = load_from_run(model, PAPER, str(pretrained))
    assert notes == [f"--init {pretrained}: 52 tensors loaded from {pretrained / 'model.safetensors'}; left new: "
                     f"W_y.weight, W_y.bias"]
    run, now = weights(pretrained), model.state_dict()
    assert set(run) == set(now) - {"W_y.weight", "W_y.bias"}
    assert all(torch.equal(now[k], run[k]) for k in run)  # the body: the run's, exactly
    assert not any(torch.equal(before[k], run[k]) for k in run if k.endswith("weight") and "norm" not in k)
    assert torch.equal(now["W_y.weight"], before["W_y.weight"]) and torch.equal(now["W_y.bias"], before["W_y.bias"])


def test_init_from_a_run_through_train_py(pretrained, tmp_path, capsys):
    """One step at lr 1e-12 moves nothing: the fine-tuned run's weights are the pre-trained body and the
    seeded new head; without --init the body is a fresh one."""
    common = ["--paper", "gpt", "--flavor", "tiny-classifier", "--max-steps", "1", "--lr", "1e-12",
              "--results-dir", str(tmp_path / "results")]
    assert train(common + ["--init", str(pretrained), "--out", str(tmp_path / "tuned")]) == 0
    out = capsys.readouterr().out
    assert f"--init {pretrained}: 52 tensors loaded from" in out and "left new: W_y.weight, W_y.bias" in out
    tuned, run = weights(tmp_path / "tuned"), weights(pretrained)
    assert max_difference({k: tuned[k] for k in run}, run) < 1e-8
    torch.manual_seed(0)  # the trainer seeds --seed 0 before it builds the model
    fresh = PAPER.build_for_data("tiny-classifier", classifier_facts())
    assert (tuned["W_y.weight"] - fresh.W_y.weight).abs().max() < 1e-8
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert config["init"] == str(pretrained) and config["flavor"] == "tiny-classifier"
    assert config["dataset"] == "pydoc-topics"

    assert train(common + ["--out", str(tmp_path / "scratch")]) == 0
    scratch = weights(tmp_path / "scratch")
    assert max_difference({k: scratch[k] for k in run}, run) > 0.01


def test_model_kwargs_go_with_a_run_directory(pretrained):
    flags = dict(paper="gpt", flavor="tiny-classifier", dataset="pydoc-topics", init=str(pretrained),
                 model_kwargs={"lm_weight": 0.0})
    validate(TrainConfig.from_dict(flags))  # accepted: the flavor is built, then what fits is loaded


def test_refusals_are_one_line(pretrained, tmp_path, capsys):
    base = ["--paper", "gpt", "--flavor", "tiny-classifier", "--out", str(tmp_path / "never")]
    assert refused(capsys, ["--paper", "lenet", "--init", str(pretrained)]) == (
        f"train.py: error: --init {pretrained}: a run of paper gpt, not of lenet; start from a run of lenet")
    wider = base + ["--init", str(pretrained), "--model-kwargs", "n_embd=64"]  # every shape another
    assert "none of the 52 tensors of" in refused(capsys, wider)
    assert refused(capsys, base + ["--init", str(tmp_path / "nothing")]) == (
        f"train.py: error: --init {tmp_path / 'nothing'}: no run directory there, nor a reference model; use "
        f"timm:NAME, torchvision:NAME, or either as SOURCE:NAME@FILE (weights read from a local file), or RUN_DIR "
        f"(a finished run of the same paper)")
    (tmp_path / "empty").mkdir()
    empty = refused(capsys, base + ["--init", str(tmp_path / "empty")])
    assert "not a run directory (no readable config.json)" in empty
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copy(pretrained / "config.json", unfinished)
    line = refused(capsys, base + ["--init", str(unfinished)])
    assert "the run has no model.safetensors: it has not finished" in line
    assert not (tmp_path / "never").exists()


def test_a_run_of_other_tokens_is_refused(tmp_path, capsys):
    """A GPT pre-trained on other text (--dataset text, its own characters): its W_e reads other characters."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog; " * 60)
    assert train(["--paper", "gpt", "--dataset", "text", "--data-dir", str(corpus), "--block-size", "32",
                  "--batch-size", "8", "--max-steps", "1", "--out", str(tmp_path / "fox"),
                  "--results-dir", str(tmp_path / "results")]) == 0
    line = refused(capsys, ["--paper", "gpt", "--flavor", "tiny-classifier", "--init", str(tmp_path / "fox")])
    assert line.startswith(f"train.py: error: --init {tmp_path / 'fox'}: the run read other tokens (text, "
                           f"--tokenizer char")
