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


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_claims_sweep_file_validates(path, capsys):
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
