"""The claims the repository tests stay runnable and findable: every sweep file in papers/*/claims/
(and the examples in sweeps/) validates with today's flags (a renamed flag, flavor or model switch fails here, not in a reader's
30-minute sweep), and every claim with a figure has its section in the paper's note and its line in
README's list."""

from pathlib import Path

import pytest

from common import sweep

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = sorted(ROOT.glob("papers/*/claims/*.yaml")) + sorted(ROOT.glob("sweeps/*.yaml"))
FIGURES = sorted(ROOT.glob("papers/*/claims/*.png"))


def stand_in_runs(path: Path, results: Path) -> None:
    """The runs a sweep's `--init RUN_DIR` starts from (a pre-training, the claim's first command, not in
    the repository): at each, a one-step run of its paper's defaults stands in, so that the file's flags
    are checked against a run of the same model."""
    from common.pretrained import is_run
    from train import main

    for params in sweep.combinations(sweep.load(path)):
        init = params.get("init")
        if isinstance(init, str) and is_run(init) and not Path(init).exists():
            assert main(["--paper", params["paper"], "--max-steps", "1", "--out", init, "--wandb", "disabled",
                         "--results-dir", str(results)]) == 0


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_claims_sweep_file_validates(path, capsys, tmp_path):
    stand_in_runs(path, tmp_path / "results")  # in this test's own working folder
    assert sweep.main([str(path), "--dry-run"]) == 0, capsys.readouterr().err
    assert "all valid" in capsys.readouterr().out


@pytest.mark.parametrize("figure", FIGURES, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_every_tested_claim_is_in_its_note_and_in_readme(figure):
    paper = figure.parent.parent
    note = (paper / "README.md").read_text()
    assert "## The claim, tested" in note and f"(claims/{figure.name})" in note
    assert (figure.with_suffix(".yaml")).exists() and f"(claims/{figure.stem}.yaml)" in note
    readme = (ROOT / "README.md").read_text()
    assert f"(papers/{paper.name}/README.md#the-claim-tested)" in readme


def test_the_claims_are_found():
    assert len(SWEEPS) >= 10 and len(FIGURES) >= 6
