"""The claims the repository tests stay runnable and findable: every sweep file in papers/*/claims/
(and the examples in sweeps/; the hypotheses beside them are tests/test_claims_verdict.py's) validates
with today's flags (a renamed flag, flavor or model switch fails here, not in a reader's 30-minute
sweep), and every claim with a figure has its section in the paper's note and its line in README's list."""

import json
import re
from pathlib import Path

import pytest

from common import claims, sweep

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = claims.sweep_files(ROOT) + sorted(ROOT.glob("sweeps/*.yaml"))  # not the hypotheses beside them
FIGURES = sorted(ROOT.glob("papers/*/claims/*.png"))


def stand_in_runs(path: Path, results: Path) -> None:
    """The runs a sweep's `--init RUN_DIR` starts from (a pre-training, the claim's first command, not in
    the repository): at each, a one-step run of its paper's defaults stands in, so that the file's flags
    are checked against a run of the same model."""
    from common.pretrained import is_run
    from train import main

    made = {}  # paper: its stand-in, which the other runs to start from link to (BERT's 9 pre-trainings)
    for params in sweep.combinations(sweep.load(path)):
        init = params.get("init")
        if isinstance(init, str):
            init = init.replace("{seed}", str(params.get("seed", 0)))  # each seed's own run (train.py's --init)
        if isinstance(init, str) and is_run(init) and not Path(init).exists():
            if params["paper"] in made:
                Path(init).parent.mkdir(parents=True, exist_ok=True)
                Path(init).symlink_to(made[params["paper"]].resolve())
                continue
            assert main(["--paper", params["paper"], "--max-steps", "1", "--out", init, "--wandb", "disabled",
                         "--results-dir", str(results)]) == 0
            made[params["paper"]] = Path(init)
        teacher = params.get("teacher")  # DeiT's: a run of the sweep its folder is named after (runs/<sweep>/...)
        if isinstance(teacher, str) and not Path(teacher).exists():
            (made,) = [s for s in map(sweep.load, SWEEPS) if s.name == Path(teacher).parent.name]
            (its,) = sweep.combinations(made)
            assert main(["--paper", its["paper"], "--dataset", its["dataset"], "--max-steps", "1", "--eval-samples",
                         "64", "--out", teacher, "--wandb", "disabled", "--results-dir", str(results)]) == 0


def trains_stand_ins(path: Path) -> bool:
    """Whether the sweep starts from runs (--init RUN_DIR, --teacher) that stand_in_runs trains: slow."""
    return any(isinstance(p.get("init"), str) or "teacher" in p for p in sweep.combinations(sweep.load(path)))


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if trains_stand_ins(p) else p for p in SWEEPS],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_claims_sweep_file_validates(path, capsys, tmp_path):
    stand_in_runs(path, tmp_path / "results")  # in this test's own working folder
    assert sweep.main([str(path), "--dry-run"]) == 0, capsys.readouterr().err
    assert "all valid" in capsys.readouterr().out


def claim_of(figure: Path) -> Path | None:
    """The sweep file a claim's figure belongs to: <sweep>.png, or <sweep>-<what it shows>.png."""
    words = figure.stem.split("-")
    found = [figure.with_name("-".join(words[:k]) + ".yaml") for k in range(len(words), 0, -1)]
    return next((f for f in found if f.exists()), None)


@pytest.mark.parametrize("figure", FIGURES, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_every_tested_claim_is_in_its_note_and_in_readme(figure):
    paper = figure.parent.parent
    note = (paper / "README.md").read_text()
    assert "## The claim, tested" in note and f"(claims/{figure.name})" in note
    sweep_file = claim_of(figure)
    assert sweep_file is not None and f"(claims/{sweep_file.name})" in note
    readme = (ROOT / "README.md").read_text()
    assert f"(papers/{paper.name}/README.md#the-claim-tested)" in readme


def test_the_claims_are_found():
    assert len(SWEEPS) >= 10 and len(FIGURES) >= 6


def test_densenets_parameter_fraction_is_read_off_its_curve(tmp_path):
    """DenseNet's claim script on made-up results: DenseNets of 1,000 / 4,000 / 16,000 parameters at 0.3 /
    0.5 / 0.7, ResNets of 6,000 and 24,000 at 0.4 and 0.6 (a DenseNet reaches those at 2,000 and 8,000: a
    third) and one of 50,000 at 0.8 (beyond every DenseNet); seeds spread +-0.01 around each mean."""
    import json

    from papers.densenet.claims import params_figure

    def runs(sweep_name, points):
        for i, (params, acc) in enumerate(points):
            for seed, noise in enumerate((-0.01, 0.0, 0.01)):
                r = {"run_id": f"{sweep_name}-{i}-{seed}", "params": params, "final": acc + noise,
                     "config": {"seed": seed, "model_kwargs": {"width": i}},
                     "sweep": {"name": sweep_name, "combination": {"model-kwargs": f"width={i}", "seed": seed}}}
                (tmp_path / f"{r['run_id']}.json").write_text(json.dumps(r))

    runs("densenet-figure-3", [(1000, 0.3), (4000, 0.5), (16000, 0.7)])
    runs("densenet-figure-3-resnet", [(6000, 0.4), (24000, 0.6), (50000, 0.8)])
    assert params_figure.main(["--results-dir", str(tmp_path), "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "figure-3.json").read_text())
    f = saved["fractions"]
    assert abs(f[0]["fraction"] - 1 / 3) < 1e-9 and abs(f[1]["fraction"] - 1 / 3) < 1e-9 and f[2]["fraction"] is None
    assert f[0]["low"] < 1 / 3 < f[0]["high"] and f[2]["drawn_in_range"] == 0
    pairs = saved["pairs"]
    assert [round(q["params_ratio"], 3) for q in pairs] == [6.0, 6.0, 3.125]
    assert [round(q["difference"], 6) for q in pairs] == [-0.1, -0.1, -0.1] and pairs[0]["high"] < 0
    assert (tmp_path / "figure-3.png").stat().st_size > 10_000
    # --data fashion-mnist reads the Fashion-MNIST sweeps' runs (none yet: refused) and writes its own files
    assert params_figure.main(["--data", "fashion-mnist", "--results-dir", str(tmp_path), "--out", str(tmp_path)]) == 2
    runs("densenet-figure-3-fashion-mnist", [(1000, 0.8), (4000, 0.85), (16000, 0.9)])
    runs("densenet-figure-3-fashion-mnist-resnet", [(2000, 0.8), (8000, 0.9), (32000, 0.95)])
    assert params_figure.main(["--data", "fashion-mnist", "--results-dir", str(tmp_path), "--out", str(tmp_path)]) == 0
    fashion = json.loads((tmp_path / "figure-3-fashion-mnist.json").read_text())
    assert [round(q["difference"], 6) for q in fashion["pairs"]] == [0.0, -0.05, -0.05]
    assert abs(fashion["fractions"][0]["fraction"] - 0.5) < 1e-9 and json.loads((tmp_path / "figure-3.json").read_text()) == saved


CLAIM_FILES = sorted(ROOT.glob("papers/*/claims/*.json"))


@pytest.mark.parametrize("path", CLAIM_FILES, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_every_file_a_claim_script_wrote_says_which_runs_and_commit(path):
    """Its `provenance`: the runs it read, each one in results/, and the commit its numbers were measured
    at (none only for a file measured before the scripts recorded it, which says so)."""
    written = json.loads(path.read_text())["provenance"]
    stored = {json.loads(p.read_text())["run_id"] for p in (ROOT / "results").glob("*.json")}
    assert written["runs_read"] and set(written["runs_read"]) <= stored, set(written["runs_read"]) - stored
    if written["commit"] is None:
        assert written["note"] == claims.UNRECORDED
    else:
        assert re.fullmatch(r"[0-9a-f]{40}", written["commit"]), written["commit"]
