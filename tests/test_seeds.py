"""Results over seeds: a sweep's rows (mean ± std, n, Student's t interval), the same grouping for any
table, epochs to a target, one parameter against another (Welch), the sweep's figure; and the curves
they read: the training accuracy every run logs, and keeps in result.json."""

import math

import pytest
import torch
from scipy import stats

from common import leaderboard, seeds
from common.data import Share, eval_loader, get_dataset
from common.tracking import store_result
from papers import get_paper
from tests.conftest import load_json, torchrun
from train import main

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`


def run(run_id, final, combination=None, seed=0, curve=None, **extra):
    """A result as the trainer writes it, of a sweep named "s" when given its combination."""
    config = {"paper": "lenet", "seed": seed, "lr": (combination or {}).get("lr", 0.001)}
    result = {"run_id": run_id, "paper": "lenet", "flavor": "tiny", "dataset": "digits", "task": "classification",
              "metric": "accuracy", "higher_is_better": True, "final": final, "final_metrics": {"accuracy": final},
              "params": 60000, "strategy": "single", "world_size": 1, "precision": "fp32", "compile": False,
              "samples_per_s": 100.0, "wall_s": 10.0, "epochs": 4, "steps": 40, "steps_per_epoch": 10,
              "finished_at": "2026-12-01T00:00:00+00:00", "commit": "a" * 40, "config": config,
              "curves": {"train/accuracy": curve or []}} | extra
    if combination is not None:
        params = combination | {"seed": seed}
        result["sweep"] = {"name": "s", "key": f"{run_id}", "combination": params}
    return result


ACCURACY = {0.001: [0.90, 0.92, 0.97], 0.01: [0.60, 0.70, 0.68]}


@pytest.fixture
def store(tmp_path):
    results = tmp_path / "results"
    for lr, values in ACCURACY.items():
        for seed, value in enumerate(values):
            # the training accuracy reaches 0.75 at step 10 * (seed + 1) for lr 0.001, never for 0.01
            curve = [[10 * (k + 1), 0.8 if (lr == 0.001 and k >= seed) else 0.5] for k in range(4)]
            store_result(run(f"r{lr}-{seed}", value, {"paper": "lenet", "lr": lr}, seed, curve), results)
    store_result(run("alone", 0.5) | {"config": {"paper": "lenet", "seed": 0, "lr": 0.1}}, results)
    return results


def test_a_sweeps_rows_are_its_combinations_over_seeds_with_t_intervals(store, capsys):
    assert leaderboard.main(["--results-dir", str(store), "--sweep", "s", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "Sweep s: paper=lenet; over seeds." in out  # the parameter with one value, said once
    for lr, values in ACCURACY.items():
        n, mean, std = len(values), sum(values) / 3, float(torch.tensor(values).std())
        half = stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)
        row = f"| lr={lr} | {mean:.4g} ± {std:.2g} | 3 | [{mean - half:.4g}, {mean + half:.4g}] | 60,000 | 10 s |"
        assert row in out, (row, out)
    assert out.index("lr=0.001") < out.index("lr=0.01")  # best first
    assert "alone" not in out


def test_sweep_runs_leave_the_ranking_tables_unless_asked(store, capsys):
    assert leaderboard.main(["--results-dir", str(store)]) == 0
    assert capsys.readouterr().out.count("lenet") == 1
    assert leaderboard.main(["--results-dir", str(store), "--include-sweeps"]) == 0
    assert capsys.readouterr().out.count("lenet") == 7


def test_group_seeds_groups_any_table_by_its_configuration(store, capsys):
    assert leaderboard.main(["--results-dir", str(store), "--include-sweeps", "--group-seeds"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "lenet" in line]
    assert len(rows) == 3  # lr 0.001 (3 seeds), lr 0.01 (3 seeds), the run alone
    assert rows[0].split()[4:7] == ["0.93", "±", "0.036"] and rows[0].split()[7] == "3"
    assert rows[-1].split()[4:7] == ["0.5", "1", "n/a"]  # one run: no spread, no interval


def test_epochs_to_a_target_and_one_value_against_the_other(store, capsys):
    args = ["--results-dir", str(store), "--sweep", "s", "--reach", "train/error<=0.25", "--versus", "lr"]
    assert leaderboard.main(args) == 0
    out = capsys.readouterr().out
    epochs = [1.0, 2.0, 3.0]  # step 10, 20, 30 of 10 steps an epoch
    assert "epochs to train/error <= 0.25" in out and "2 ± 1 " in out and "3 of 3" in out and "0 of 3" in out
    # in minutes (a speedrun's clock): each run's 40 steps took its wall_s of 10 s, so step 10 came at 2.5 s
    assert leaderboard.main(args[:-2] + ["--reach-in", "minutes"]) == 0
    out = capsys.readouterr().out
    assert "minutes to train/error <= 0.25" in out and f"{5 / 60:.4g} ± {2.5 / 60:.2g} " in out
    assert leaderboard.main(["--results-dir", str(store), "--sweep", "s", "--reach-in", "minutes"]) == 2
    assert "add --reach" in capsys.readouterr().err
    # lr 0.001 never reaches 0.75 at 0.01: no number to compare it with
    r = seeds.ratio([0.90, 0.92, 0.97], [0.60, 0.70, 0.68])
    d = seeds.welch([0.90, 0.92, 0.97], [0.60, 0.70, 0.68])
    assert d[1] < d[0] < d[2] and r[1] < r[0] < r[2]
    assert seeds.summarize(epochs).mean == 2.0

    assert leaderboard.main(["--results-dir", str(store), "--sweep", "s", "--versus", "lr"]) == 0
    out = capsys.readouterr().out
    assert f"{d[0]:+.4g} [{d[1]:.4g}, {d[2]:.4g}]" in out and f"{r[0]:.3g} [{r[1]:.4g}, {r[2]:.4g}]" in out


def test_where_keeps_the_combinations_with_the_values_it_names(store, capsys):
    assert leaderboard.main(["--results-dir", str(store), "--sweep", "s", "--where", "lr=0.01"]) == 0
    out = capsys.readouterr().out
    assert "Sweep s: paper=lenet, lr=0.01; over seeds." in out and "0.001" not in out
    for args, words in ((["--where", "momentum=0.9"], "parameters that vary are lr"),
                        (["--where", "lr=0.5"], "no combination has it; its values are 0.001, 0.01"),
                        (["--where", "lr"], "write PARAM=VALUE")):
        assert leaderboard.main(["--results-dir", str(store), "--sweep", "s", *args]) == 2
        assert words in capsys.readouterr().err
    assert leaderboard.main(["--results-dir", str(store), "--where", "lr=0.01"]) == 2
    assert "add --sweep" in capsys.readouterr().err


def test_welch_and_t_intervals_equal_scipys():
    a, b = [1.0, 2.0, 4.0, 3.5], [0.5, 0.9, 1.1]
    d, lo, hi = seeds.welch(a, b)
    test = stats.ttest_ind(a, b, equal_var=False)
    low, high = test.confidence_interval(0.95)
    assert (lo, hi) == pytest.approx((low, high)) and d == pytest.approx(sum(a) / 4 - sum(b) / 3)
    s = seeds.summarize(a)
    assert (s.low, s.high) == pytest.approx(stats.t.interval(0.95, 3, loc=s.mean, scale=stats.sem(a)))
    assert math.isnan(seeds.summarize([1.0]).low)


def test_a_sweep_draws_and_writes_its_own_section(store, tmp_path):
    png = tmp_path / "s.png"
    assert leaderboard.main(["--results-dir", str(store), "--sweep", "s", "--plot", str(png),
                             "--curve", "train/error"]) == 0
    assert png.stat().st_size > 10_000
    note = tmp_path / "note.md"
    start, end = leaderboard.markers("s")
    note.write_text(f"before\n{start}\nold\n{end}\nafter\n")
    assert leaderboard.main(["--results-dir", str(store), "--sweep", "s", "--format", "markdown",
                             "--write", str(note)]) == 0
    text = note.read_text()
    assert text.startswith(f"before\n{start}\nSweep s") and text.endswith(f"{end}\nafter\n") and "old" not in text


def test_two_sweeps_shown_together_are_one_experiments_arms(store, capsys):
    """--sweep A B: the runs of both (a claim's arms in two files), grouped by combination; the parameter that
    differs between the files is shown per row, a missing name is one line."""
    other = run("b0", 0.5, {"paper": "alexnet", "lr": 0.001}) | {"paper": "alexnet"}
    other["sweep"]["name"] = "s2"
    store_result(other, store)
    assert leaderboard.main(["--results-dir", str(store), "--sweep", "s", "s2", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "Sweep s + s2: no parameter fixed; over seeds." in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "paper=" in line]
    assert len(rows) == 3 and any("paper=alexnet, lr=0.001 | 0.5 " in r for r in rows), rows
    assert leaderboard.main(["--results-dir", str(store), "--sweep", "s"]) == 0
    assert "alexnet" not in capsys.readouterr().out  # one sweep alone: its own runs only
    assert leaderboard.main(["--results-dir", str(store), "--sweep", "s", "t"]) == 2
    assert "no runs of a sweep named 't'" in capsys.readouterr().err


def test_bad_sweep_queries_are_one_line(store, capsys):
    for args, words in ((["--sweep", "t"], "sweeps there: s"), (["--reach", "x<0.2", "--sweep", "s"], "CURVE<=VALUE"),
                        (["--sweep", "s", "--versus", "momentum"], "parameters are lr"),
                        (["--reach", "train/error<=0.2"], "add --sweep"), (["--where", "lr=1"], "add --sweep")):
        assert leaderboard.main(["--results-dir", str(store), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


def test_a_fixed_share_of_the_training_split():
    train, _ = get_dataset("adding").load()
    a, b = Share(train, 0.3), Share(train, 0.3)
    assert a.indices == b.indices and len(a) == 3000 and set(Share(train, 0.1).indices) <= set(a.indices)
    assert a.sizes == [train.sizes[i] for i in a.indices]


def test_eval_samples_scores_a_fixed_count_of_the_test_split_whatever_the_processes(tmp_path, capsys):
    """--eval-samples N: the same N test samples for every run (a share of the split, drawn as
    --train-fraction's), which each rank's share of them (eval_loader) covers once; said when the run starts."""
    _, test = get_dataset("adding").load()
    share = Share(test, count=64)
    assert len(share) == 64 and share.indices == Share(test, count=64).indices and share.indices == sorted(share.indices)
    assert set(Share(test, count=32).indices) <= set(share.indices) and len(Share(test, count=10**6)) == len(test)
    ranks = [eval_loader(share, 16, rank, 2).dataset.indices for rank in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == list(range(64))
    run = tmp_path / "run"
    assert main(["--paper", "lenet", "--max-steps", "1", "--eval-samples", "50", "--wandb", "disabled",
                 "--out", str(run), "--results-dir", str(tmp_path / "results")]) == 0
    assert "evaluating on 50 of the test split's 360 samples (--eval-samples)" in capsys.readouterr().out
    assert load_json(run / "result.json")["config"]["eval_samples"] == 50


# ---------------------------------------------------------------- the training accuracy


SHARE = 1436 / 1437  # 1436 of the 1437 training digits: 2 steps of 718, 359 a rank on 2 ranks
# one epoch sees each of those digits once; lr 1e-30 leaves the weights as they were
FROZEN = ["--paper", "lenet", "--train-fraction", repr(SHARE), "--batch-size", "718", "--epochs", "1",
          "--lr", "1e-30", "--warmup-steps", "0", "--log-every", "2", "--wandb", "disabled"]


def expected_accuracy() -> float:
    """LeNet-5's initial accuracy (seed 0) on that share of the digits' training split."""
    data = get_dataset("digits")
    torch.manual_seed(0)
    model = get_paper("lenet").build_for_data("tiny", data.facts(image_size=32))
    share = Share(data.load(image_size=32)[0], SHARE)
    images, labels = (torch.stack(t) for t in zip(*(share[i] for i in range(len(share)))))
    with torch.no_grad():
        return (model(images).argmax(1) == labels).double().mean().item()


def test_the_training_accuracy_is_of_every_rank_and_kept_in_the_result(tmp_path):
    """train/accuracy (since the last log line) and train/epoch_accuracy count every training sample once,
    over all ranks: with weights that do not move, both are the initial model's accuracy on the share."""
    expected = expected_accuracy()
    assert main(FROZEN + ["--out", str(tmp_path / "one"), "--results-dir", str(tmp_path / "r")]) == 0
    torchrun(FROZEN + ["--out", str(tmp_path / "two"), "--results-dir", str(tmp_path / "r")], cwd=tmp_path)
    for name in ("one", "two"):
        curves = load_json(tmp_path / name / "result.json")["curves"]
        assert curves["train/accuracy"] == [[2, pytest.approx(expected, abs=1e-12)]], name
        assert curves["train/epoch_accuracy"] == [[2, pytest.approx(expected, abs=1e-12)]], name
        assert [step for step, _ in curves["eval/accuracy"]] == [2] and len(curves["train/loss"]) == 1
        (step, wall), = curves["time/wall_s"]  # the wall time at each evaluation: accuracy against time
        assert step == 2 and 0 < wall <= load_json(tmp_path / name / "result.json")["wall_s"]
