"""--model-kwargs: a flavor's constructor arguments from the command line, read as Python literals,
recorded in config.json, resumed with the run and shown in the leaderboard's flavor column."""

import pytest

from common import leaderboard
from common.config import describe_kwargs, parse_model_kwargs
from tests.conftest import bitwise_equal, interrupted_copy, load_json, weights
from train import main


def test_values_are_python_literals_or_plain_strings():
    assert parse_model_kwargs(["activation=tanh", "depth=3", "p=0.5", "lrn=False", "init=None"]) == {
        "activation": "tanh", "depth": 3, "p": 0.5, "lrn": False, "init": None}
    assert parse_model_kwargs(["shift=false", "bias=TRUE", "name='false'"]) == {"shift": False, "bias": True,
                                                                                 "name": "false"}
    # several in one argument, as one W&B sweep value holds them, and a tuple with spaces in it (kept as a list)
    assert parse_model_kwargs(["cell=rnn hidden_size=64", "widths=(16, 32, 64)", "name='a b'"]) == {
        "cell": "rnn", "hidden_size": 64, "widths": [16, 32, 64], "name": "a b"}
    assert describe_kwargs({"activation": "tanh", "widths": [16, 32], "lrn": False}) == \
        "activation=tanh, widths=(16, 32), lrn=False"
    for bad, words in ((["tanh"], "KEY=VALUE"), (["a=1", "a=2"], "twice"), (["2x=1"], "KEY=VALUE"),
                       (["d={'a': 1}"], "a value is")):
        with pytest.raises(ValueError, match=words):
            parse_model_kwargs(bad)


FLAGS = ["--paper", "lenet", "--model-kwargs", "f6=32", "--max-steps", "4", "--ckpt-every", "2", "--batch-size",
         "32", "--wandb", "disabled"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("kwargs") / "run"
    assert main(FLAGS + ["--out", str(out), "--results-dir", str(out.parent / "results")]) == 0
    return out


def test_they_build_the_model_and_are_recorded(run):
    """F6 of 32 units instead of LeNet-5's 84: the parameter count says the model was built with it."""
    config, result = load_json(run / "config.json"), load_json(run / "result.json")
    assert config["model_kwargs"] == {"f6": 32}
    assert result["params"] == 60_000 - 84 * 121 + 32 * 121
    assert leaderboard.flavor(result) == "tiny, f6=32"
    text = leaderboard.render(leaderboard.rank([result]), "markdown")
    assert "| lenet | tiny, f6=32 |" in text


def test_a_resumed_run_keeps_them_and_is_bitwise_the_uninterrupted_one(run, tmp_path):
    copy = interrupted_copy(run, 2, tmp_path / "copy")
    assert main(["--resume", str(copy), "--wandb", "disabled"]) == 0
    assert bitwise_equal(weights(copy), weights(run))
    assert load_json(copy / "config.json")["model_kwargs"] == {"f6": 32}


def test_a_resume_given_other_ones_is_refused(run, tmp_path, capsys):
    copy = interrupted_copy(run, 2, tmp_path / "copy-refused")
    assert main(["--resume", str(copy), "--model-kwargs", "f6=84"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model-kwargs cannot change" in err[0] and "{'f6': 32}" in err[0]
    assert main(["--resume", str(copy), "--model-kwargs", "f6=32", "--wandb", "disabled"]) == 0  # the same: resumes
    assert bitwise_equal(weights(copy), weights(run))


def test_evaluate_builds_the_run_with_them_and_takes_others_that_fit_the_weights(run, capsys):
    """common.evaluate (and export, predict: the same load_run) rebuilds the run's F6 of 32 units; other
    arguments fit only where the trained weights still do."""
    from common import evaluate

    final = load_json(run / "result.json")["final"]
    capsys.readouterr()
    assert evaluate.main(["--run", str(run)]) == 0
    assert f"accuracy: {final:.4f}" in capsys.readouterr().out
    for kwargs, words in (("f6=84", "f6=84"), ("widht=3", "no argument 'widht'")):
        assert evaluate.main(["--run", str(run), "--model-kwargs", kwargs]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
