"""The results store and the leaderboard: ranking, concurrent writers, interrupted and resumed runs,
reruns, the wandb source, the README section, the plot."""

import pytest

import glob
import json
import multiprocessing
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace


from common import leaderboard
from common.tracking import store_result
from tests.conftest import ROOT, interrupted_copy, launch_env, load_json
from train import main

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`


def fake(run_id, paper, final, task="classification", dataset="digits", **extra):
    metric, higher = ("accuracy", True) if task == "classification" else ("mse", False)
    return {"run_id": run_id, "paper": paper, "flavor": "tiny", "dataset": dataset, "task": task, "metric": metric,
            "higher_is_better": higher, "final": final, "params": 1000, "strategy": "single", "world_size": 1,
            "precision": "fp32", "compile": False, "samples_per_s": 100.0, "wall_s": 10.0,
            "finished_at": "2026-11-29T00:00:00+00:00", "commit": "abcdef1234", "config": {"paper": paper}} | extra


RESULTS = [fake("a", "vit", 0.90), fake("b", "vit", 0.97), fake("c", "resnet", 0.95),
           fake("d", "lstm", 0.010, task="regression", dataset="adding"),
           fake("e", "lstm", 0.002, task="regression", dataset="adding")]


def test_each_task_kind_ranks_its_own_way():
    tables = leaderboard.rank(RESULTS)
    assert list(tables) == [("classification", "digits"), ("regression", "adding")]
    assert [r["run_id"] for r in tables["classification", "digits"]] == ["b", "c", "a"]  # accuracy: higher first
    assert [r["run_id"] for r in tables["regression", "adding"]] == ["e", "d"]  # mse: lower first
    best = leaderboard.rank(RESULTS, best_only=True)
    assert [r["run_id"] for r in best["classification", "digits"]] == ["b", "c"]
    assert list(leaderboard.rank(RESULTS, paper="lstm")) == [("regression", "adding")]
    assert list(leaderboard.rank(RESULTS, dataset="digits")) == [("classification", "digits")]
    partial = fake("f", "vit", 0.99, config={"paper": "vit", "eval_samples": 64})  # scored on 64 test samples
    assert [r["run_id"] for r in leaderboard.rank(RESULTS + [partial])["classification", "digits"]] == ["b", "c", "a"]


def test_top_keeps_the_first_rows_of_each_table(tmp_path, capsys):
    """README's block: each data set's best run (--best-only --top 1)."""
    for r in RESULTS:
        store_result(r, tmp_path)
    assert leaderboard.main(["--results-dir", str(tmp_path), "--format", "json", "--best-only", "--top", "1"]) == 0
    tables = json.loads(capsys.readouterr().out)
    assert {k: [r["run_id"] for r in rows] for k, rows in tables.items()} == {
        "classification / digits": ["b"], "regression / adding": ["e"]}
    # in markdown, the best of each data set are the rows of one table (README's block), not a table each
    assert leaderboard.main(["--results-dir", str(tmp_path), "--format", "markdown", "--best-only", "--top", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| data set | task | better | paper |") and "| rank |" not in lines[0]
    assert [line.split(" | ")[:3] for line in lines[2:]] == [["| **digits**", "classification", "higher"],
                                                            ["| **adding**", "regression", "lower"]]
    assert leaderboard.main(["--results-dir", str(tmp_path), "--format", "markdown", "--top", "2"]) == 0
    assert capsys.readouterr().out.startswith("**digits** (classification, accuracy, higher is better)")
    assert leaderboard.main(["--results-dir", str(tmp_path), "--top", "0"]) == 2
    assert "--top 0" in capsys.readouterr().err


def test_a_language_models_char_and_bpe_runs_each_keep_their_best_and_say_their_tokenizer():
    lm = dict(task="language-modeling", dataset="pydoc", metric="bits_per_char", higher_is_better=False)
    bpe = lambda vocab: {"paper": "gpt", "tokenizer": "bpe", "vocab_size": vocab}
    runs = [fake("c1", "gpt", 1.7, **lm), fake("c2", "gpt", 1.9, **lm),
            fake("b1", "gpt", 1.8, **lm, config=bpe(None)), fake("b2", "gpt", 2.1, **lm, config=bpe(None)),
            fake("b3", "gpt", 1.6, **lm, config=bpe(512))]
    best = leaderboard.rank(runs, best_only=True)["language-modeling", "pydoc"]
    assert [r["run_id"] for r in best] == ["b3", "c1", "b1"]  # lower is better; one per tokenizer and size
    assert [leaderboard.cells(1, r)["flavor"] for r in best] == ["tiny, bpe 512", "tiny", "tiny, bpe 1024"]


def test_formats(tmp_path, capsys):
    for r in RESULTS:
        store_result(r, tmp_path)
    assert leaderboard.main(["--results-dir", str(tmp_path), "--format", "json"]) == 0
    tables = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in tables["classification / digits"]] == ["b", "c", "a"]
    assert leaderboard.main(["--results-dir", str(tmp_path), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("task,dataset,rank,paper,flavor,metric,params,strategy") and len(lines) == 6
    assert leaderboard.main(["--results-dir", str(tmp_path), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "**digits** (classification, accuracy, higher is better)" in out and "| 1 | vit | tiny | accuracy 0.97 |" in out
    assert leaderboard.main(["--results-dir", str(tmp_path)]) == 0
    assert "adding (regression, mse, lower is better)" in capsys.readouterr().out


def _write(args):
    results_dir, i = args
    store_result(fake(f"run{i % 6}", "vit", i / 100), results_dir)


def test_concurrent_writers_lose_nothing_and_overwrite_nothing(tmp_path):
    with multiprocessing.get_context("fork").Pool(4) as pool:  # processes that write files, nothing else
        pool.map(_write, [(str(tmp_path), i) for i in range(24)])  # 6 runs, each written 4 times at once
    entries = sorted(p.name for p in tmp_path.iterdir())
    assert entries == [f"run{i}.json" for i in range(6)], "no temporary files left, one entry per run"
    for i in range(6):
        assert load_json(tmp_path / f"run{i}.json")["final"] in {(i + 6 * k) / 100 for k in range(4)}


def test_a_killed_run_is_no_result_and_once_resumed_it_is_one(tmp_path, capsys):
    flags = ["--paper", "vit", "--max-steps", "80", "--ckpt-every", "5", "--wandb", "disabled", "--out", "run"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *flags], cwd=tmp_path, env=launch_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not glob.glob(str(tmp_path / "run/checkpoints/step_*/.metadata")):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").iterdir())
    assert leaderboard.main(["--results-dir", str(tmp_path / "results"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {}

    assert main(["--resume", str(tmp_path / "run"), "--results-dir", str(tmp_path / "results")]) == 0
    assert [p.name for p in (tmp_path / "results").iterdir()] == ["run.json"]
    capsys.readouterr()
    assert leaderboard.main(["--results-dir", str(tmp_path / "results"), "--format", "json"]) == 0
    [rows] = json.loads(capsys.readouterr().out).values()
    assert [r["run_id"] for r in rows] == ["run"] and rows[0]["steps"] == 80


def test_a_resumed_run_is_listed_once(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["--paper", "vit", "--max-steps", "12", "--ckpt-every", "4", "--keep-ckpts", "5", "--wandb",
                 "disabled", "--out", str(run), "--results-dir", str(tmp_path / "first")]) == 0
    resumed = interrupted_copy(run, 4, tmp_path / "resumed")
    assert main(["--resume", str(resumed), "--results-dir", str(tmp_path / "store")]) == 0
    capsys.readouterr()
    assert leaderboard.main(["--results-dir", str(tmp_path / "store"), "--format", "json"]) == 0
    [rows] = json.loads(capsys.readouterr().out).values()
    assert [r["run_id"] for r in rows] == ["resumed"] and rows[0]["steps"] == 12


def test_rerun_reproduces_the_config_in_a_new_run_directory(tmp_path, capsys, monkeypatch):
    flags = ["--paper", "vit", "--max-steps", "3", "--lr", "0.002", "--seed", "5", "--wandb", "disabled"]
    assert main(flags + ["--out", str(tmp_path / "first")]) == 0
    first = load_json(tmp_path / "first" / "result.json")
    capsys.readouterr()
    monkeypatch.setattr("common.tracking.git_commit", lambda: "0000000 another commit")
    assert main(["--rerun", first["run_id"], "--out", str(tmp_path / "again")]) == 0  # by run id, from the store
    err = capsys.readouterr().err
    assert "warning: this checkout is at commit 0000000" in err and first["run_id"] in err
    again = load_json(tmp_path / "again" / "config.json")
    assert again == load_json(tmp_path / "first" / "config.json") | {"out": str(tmp_path / "again")}
    assert main(["--rerun", str(tmp_path / "first"), "--lr", "0.1"]) == 2  # only where it goes may change
    assert "--lr cannot change in a rerun" in capsys.readouterr().err


class StandInRun(SimpleNamespace):
    """What the leaderboard reads of a wandb.apis.public.Run."""


class StandInApi:
    """The part of wandb.Api that the leaderboard uses: runs(path) -> runs with id, name, state, summary, config."""

    def __init__(self, runs):
        self._runs, self.asked = runs, []

    def runs(self, path):
        self.asked.append(path)
        return self._runs


def test_the_wandb_source_builds_the_same_tables(capsys):
    runs = [StandInRun(id=f"w{i}", name=r["run_id"], state="finished", summary=r, config=r["config"])
            for i, r in enumerate(RESULTS)]
    runs.append(StandInRun(id="crashed", name="x", state="crashed", summary=fake("x", "vit", 0.99), config={}))
    api = StandInApi(runs)
    assert leaderboard.main(["--source", "wandb", "--project", "group/paper-study", "--format", "json"], api=api) == 0
    assert api.asked == ["group/paper-study"]
    tables = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in tables["classification / digits"]] == ["b", "c", "a"], "a crashed run is no result"
    assert tables["classification / digits"][0]["wandb_run_id"] == "w1"


def test_write_replaces_only_the_marked_section(tmp_path, capsys):
    for r in RESULTS:
        store_result(r, tmp_path / "results")
    readme = tmp_path / "README.md"
    before, after = "# Title\n\nintro text\n\n", "\n\n## Next section\n\nmore text, kept as it is\n"
    readme.write_text(f"{before}{leaderboard.START}\nold table\n{leaderboard.END}{after}")
    assert leaderboard.main(["--results-dir", str(tmp_path / "results"), "--format", "markdown", "--best-only",
                             "--write", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith(before + leaderboard.START + "\n") and text.endswith(leaderboard.END + after)
    assert "old table" not in text and "| 1 | vit |" in text and "| 1 | lstm |" in text
    readme.write_text("no markers here\n")
    assert leaderboard.main(["--results-dir", str(tmp_path / "results"), "--write", str(readme)]) == 2
    assert "needs one '<!-- leaderboard:start -->' line" in capsys.readouterr().err
    assert readme.read_text() == "no markers here\n"


def test_plot_draws_the_runs_curves(tmp_path):
    for seed in ("1", "2"):
        assert main(["--paper", "vit", "--max-steps", "24", "--log-every", "4", "--seed", seed, "--wandb", "disabled",
                     "--out", str(tmp_path / f"run{seed}")]) == 0
    out = tmp_path / "curves.png"
    assert leaderboard.main(["--plot", str(out), "--runs", "run1", str(tmp_path / "run2")]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    # one table's runs against parameters and speed; only runs of the epochs asked for
    points = tmp_path / "points.png"
    assert leaderboard.main(["--plot", str(points), "--dataset", "digits", "--epochs", "2"]) == 0
    assert points.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and points.stat().st_size > 10_000
    assert leaderboard.main(["--plot", str(points), "--epochs", "3"]) == 2  # no run of 3 epochs: no table
    assert leaderboard.main(["--format", "json", "--epochs", "3"]) == 0


def test_the_committed_results_are_real_runs_of_clean_commits():
    """results/ holds the curated runs that README and the notes quote: each of a committed, clean tree
    and a run directory under runs/ (a sweep's under runs/<sweep>/), named after its run id (tests
    write their runs elsewhere)."""
    import re

    from tests.conftest import ROOT

    tracked = subprocess.run(["git", "ls-files", "results/*.json"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert tracked, "the store holds the runs README quotes"
    for name in tracked:
        result = json.loads((ROOT / name).read_text())
        assert re.fullmatch(r"[0-9a-f]{40}", result["commit"] or ""), f"{name}: commit {result['commit']}"
        sweep = (result.get("sweep") or {}).get("name")
        run_dir = f"runs/{sweep}/{result['run_id']}" if sweep else f"runs/{result['run_id']}"  # a sweep's runs
        assert result["run_dir"] == run_dir and name == f"results/{result['run_id']}.json", name


def test_a_result_records_the_code_its_processes_started_at():
    """The commit a process started at is the code it ran (Python read it then); a checkout that moved on
    under it is said apart, and a resume at another commit is listed."""
    from common.tracking import provenance, short_commit

    assert provenance(["a" * 40], "a" * 40) == {"commit": "a" * 40, "commit_at_start": "a" * 40}
    moved = provenance(["a" * 40, "b" * 40 + "-dirty"], "c" * 40)
    assert moved == {"commit": "b" * 40 + "-dirty", "commit_at_start": "a" * 40, "commits": ["a" * 40, "b" * 40 + "-dirty"],
                     "checkout_at_end": "c" * 40}
    assert short_commit(moved) == "aaaaaaa..bbbbbbb*"


def test_wall_curves_draw_each_sweeps_curve_against_minutes(tmp_path, capsys):
    """--wall-curves: each logged step at the run's mean rate (a run of 600 s and 100 steps puts step 50 at
    5 minutes); one line per sweep, its seeds' mean; refusals in one line."""
    store = tmp_path / "results"
    store.mkdir()
    for name, paper, wall in (("fast", "resnet", 600.0), ("slow", "vit", 1200.0)):
        for seed in (0, 1):
            run = fake(f"{name}-{seed}", paper, 0.9, wall_s=wall, steps=100, sweep={"name": name, "combination":
                       {"paper": paper, "seed": seed}}, curves={"eval/accuracy": [[50, 0.8 + seed / 100], [100, 0.9]]})
            (store / f"{name}-{seed}.json").write_text(json.dumps(run))
    assert leaderboard.wall_points(json.loads((store / "fast-0.json").read_text()), "eval/accuracy") == [
        (5.0, 0.8), (10.0, 0.9)]
    out = tmp_path / "wall.png"
    assert leaderboard.main(["--results-dir", str(store), "--plot", str(out), "--wall-curves", "fast", "slow",
                             "--curve", "eval/accuracy"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    capsys.readouterr()
    assert leaderboard.main(["--results-dir", str(store), "--wall-curves", "fast"]) == 2
    assert "--wall-curves goes with --plot FILE" in capsys.readouterr().err
    assert leaderboard.main(["--results-dir", str(store), "--plot", str(out), "--wall-curves", "fast",
                             "--curve", "train/loss"]) == 2
    assert "run fast-0 has no curve train/loss; its curves: eval/accuracy" in capsys.readouterr().err
    assert leaderboard.main(["--results-dir", str(store), "--plot", str(out), "--wall-curves", "none"]) == 2
    assert "no runs of a sweep named 'none'" in capsys.readouterr().err


def test_a_pipe_in_a_combination_stays_in_its_markdown_cell(tmp_path, capsys):
    """A sweep parameter holding a regular expression (VGG's --init-tensors 'a|b') is one cell of the markdown
    table, its "|" escaped, so each row has as many cells as the header."""
    store = tmp_path / "results"
    store.mkdir()
    for pattern in ("fc6|fc7", "fc8"):
        for seed in (0, 1):
            run = fake(f"{pattern}-{seed}", "vgg", 0.9 + seed / 100, sweep={"name": "deep", "combination": {
                "paper": "vgg", "init-tensors": pattern, "seed": seed}})
            (store / f"{pattern.replace('|', '_')}-{seed}.json").write_text(json.dumps(run))
    assert leaderboard.main(["--results-dir", str(store), "--sweep", "deep", "--format", "markdown"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    cells = [len(re.split(r"(?<!\\)\|", line)) for line in rows]  # split at each unescaped "|"
    assert len(rows) == 4 and len(set(cells)) == 1, rows
    assert any("init-tensors=fc6\\|fc7" in line for line in rows)


def test_a_parameter_of_one_sweep_only_is_shown_once_unless_it_tells_two_arms_apart(tmp_path, capsys):
    """--sweep A B: a parameter that B sets to one value and A leaves out (VGG's deeper nets' --init) goes to the
    header, "(in B only)", not into each of B's rows; where it is all that tells two arms apart, it stays."""
    store = tmp_path / "results"
    store.mkdir()
    arms = [("shallow", {"flavor": "A"}), ("deep", {"flavor": "B", "init": "runs/A"}), ("twin", {"flavor": "A"}),
            ("twin-init", {"flavor": "A", "init": "runs/A"})]
    for name, combination in arms:
        for seed in (0, 1):
            run = fake(f"{name}-{seed}", "vgg", 0.9 + seed / 100, sweep={"name": name, "combination": {
                "paper": "vgg", "seed": seed} | combination})
            (store / f"{name}-{seed}.json").write_text(json.dumps(run))
    assert leaderboard.main(["--results-dir", str(store), "--sweep", "shallow", "deep", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "init=runs/A (in deep only)" in out.splitlines()[0]
    assert {line.split(" | ")[1] for line in out.splitlines()[4:]} == {"flavor=A", "flavor=B"}
    assert leaderboard.main(["--results-dir", str(store), "--sweep", "twin", "twin-init", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "init=" not in out.splitlines()[0]
    assert {line.split(" | ")[1] for line in out.splitlines()[4:]} == {"-", "init=runs/A"}


def test_a_claims_figure_names_its_combinations_by_the_arms_of_its_hypothesis(tmp_path, monkeypatch):
    """fcn-table-2's runs are drawn as the hypothesis's FCN-32s, FCN-16s and FCN-8s; a parameter the arm leaves
    open is written beside its name, and a combination no hypothesis names keeps its parameters."""
    from matplotlib.figure import Figure

    from common import claims

    store = tmp_path / "results"
    store.mkdir()
    for variant, lr in (("32s", 0.001), ("16s", 0.001), ("8s", 0.001), ("8s", 0.01), ("4s", 0.001)):
        for seed in (0, 1):
            run = fake(f"{variant}-{lr}-{seed}", "fcn", 0.3 + seed / 100, steps=100, steps_per_epoch=50, epochs=2,
                       sweep={"name": "fcn-table-2", "combination": {"paper": "fcn", "seed": seed, "lr": lr,
                                                                     "model-kwargs": f"variant={variant}"}},
                       curves={"eval/accuracy": [[50, 0.2], [100, 0.3 + seed / 100]]})
            (store / f"{variant}-{lr}-{seed}.json").write_text(json.dumps(run))
    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    assert leaderboard.main(["--results-dir", str(store), "--sweep", "fcn-table-2", "--plot",
                             str(tmp_path / "table-2.png"), "--curve", "eval/accuracy"]) == 0
    ticks = sorted(t.get_text() for t in drawn[-1].axes[0].get_yticklabels())
    assert ticks == ["FCN-16s, lr=0.001", "FCN-32s, lr=0.001", "FCN-8s, lr=0.001", "FCN-8s, lr=0.01",
                     "lr=0.001, model-kwargs=variant=4s"]
    legend = sorted(t.get_text() for t in drawn[-1].axes[1].get_legend().get_texts())
    assert legend == [f"{tick} (n 2)" for tick in ticks]
    # two hypotheses that name one combination differently: both names
    named = claims.arm_names()
    assert ("fcn-table-2", {"model-kwargs": "variant=8s"}, "FCN-8s") in named
    runs = [{"sweep": {"name": "fcn-table-2", "combination": {"model-kwargs": "variant=8s"}}}]
    assert leaderboard.arm_label(runs, {}, named) == "FCN-8s"
    assert leaderboard.arm_label(runs, {}, named + [("fcn-table-2", {"model-kwargs": "variant=8s"}, "8s")]) == "FCN-8s / 8s"
    assert leaderboard.arm_label(runs, {"lr": 0.1}, named) == "FCN-8s, lr=0.1"
    assert leaderboard.arm_label([{"sweep": {"name": "fcn-table-2", "combination": {}}}], {}, named) is None


def test_figures_name_each_arm_and_tell_the_eleventh_curve_from_the_first(tmp_path, monkeypatch):
    """A claim's arm that is another sweep's defaults (it sets nothing) is named by its sweep, not by the
    joined names; past the ten colours of the cycle, --wall-curves draws the same colours dashed."""
    from matplotlib.figure import Figure

    store = tmp_path / "results"
    store.mkdir()
    for name, combination in (("base", {}), ("arm", {"model-kwargs": "shift=false"})):
        for seed in (0, 1):
            run = fake(f"{name}-{seed}", "swin", 0.8 + seed / 100, steps=100, steps_per_epoch=50, epochs=2,
                       sweep={"name": name, "combination": {"paper": "swin", "seed": seed} | combination},
                       curves={"eval/accuracy": [[50, 0.7], [100, 0.8 + seed / 100]]})
            (store / f"{name}-{seed}.json").write_text(json.dumps(run))
    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    assert leaderboard.main(["--results-dir", str(store), "--sweep", "base", "arm", "--plot",
                             str(tmp_path / "claim.png"), "--curve", "eval/accuracy"]) == 0
    ticks = [t.get_text() for t in drawn[-1].axes[0].get_yticklabels()]
    assert sorted(ticks) == ["base", "model-kwargs=shift=false"]
    for i in range(11):
        for seed in (0, 1):
            run = fake(f"w{i}-{seed}", "vit", 0.9, wall_s=60.0, steps=100, sweep={"name": f"w{i}", "combination":
                       {"seed": seed}}, curves={"eval/accuracy": [[50, 0.8], [100, 0.9]]})
            (store / f"w{i}-{seed}.json").write_text(json.dumps(run))
    assert leaderboard.main(["--results-dir", str(store), "--plot", str(tmp_path / "wall.png"), "--wall-curves",
                             *[f"w{i}" for i in range(11)], "--curve", "eval/accuracy"]) == 0
    means = [line for line in drawn[-1].axes[0].get_lines() if line.get_label().startswith("vit")]
    assert [line.get_linestyle() for line in means] == ["-"] * 10 + ["--"]
    assert means[10].get_color() == means[0].get_color()
