"""Claims' verdicts are computed, not written by hand: a made-up results store gets exactly the verdict
the rule in docs/claims.md gives, Holm's correction over a claim's pairs can undo a borderline pair, the
Transformer's 4 against 16 heads comes out of results/ as issue 43 computed it, every claim file has its
hypothesis, and what README, docs/claims.md and the notes write is what the tool computes today."""

import json
import re
import shutil

import pytest

from common import claims, leaderboard, seeds
from common.errors import ConfigError
from tests.conftest import ROOT

SWEEP = """name: made-up
program: train.py
method: grid
parameters:
  paper: {value: lenet}
  arm: {values: [base, up, down, same, noisy, border, border2, border3]}
  seed: {values: [0, 1, 2]}
"""
VALUES = {"base": [10.0, 10.1, 9.9], "up": [12.0, 12.1, 11.9], "down": [8.0, 8.1, 7.9],
          "same": [10.01, 10.11, 9.91], "noisy": [9.0, 11.0, 13.0], "border": [10.3, 10.4, 10.2],
          "border2": [10.3, 10.4, 10.2], "border3": [10.3, 10.4, 10.2]}


def made_up(tmp_path, claims_yaml: str) -> claims.Hypothesis:
    """A sweep file, its hypothesis with these claims, and a store of 3 seeds per arm (VALUES)."""
    folder = tmp_path / "papers" / "made" / "claims"
    folder.mkdir(parents=True)
    (folder / "made-up.yaml").write_text(SWEEP)
    arms = "".join(f"  {arm}: {{arm: {arm}}}\n" for arm in VALUES)
    (folder / "made-up.hypothesis.yaml").write_text(
        f"paper: Made\ntitle: made up\nmetric: accuracy\narms:\n{arms}claims:\n{claims_yaml}")
    for arm, values in VALUES.items():
        for seed, v in enumerate(values):
            r = {"run_id": f"made-up-{arm}-{seed}", "paper": "lenet", "metric": "accuracy", "final": v,
                 "sweep": {"name": "made-up", "combination": {"paper": "lenet", "arm": arm, "seed": seed}}}
            (tmp_path / "results" / f"{r['run_id']}.json").parent.mkdir(exist_ok=True)
            (tmp_path / "results" / f"{r['run_id']}.json").write_text(json.dumps(r))
    return claims.load(folder / "made-up.yaml")


def one_pair_claims(pairs: list[tuple[str, float | None, float | None]]) -> str:
    """A claim of its own for each (pair, paper's effect, smallest difference that counts)."""
    return "".join(f"  - label: claim {i}\n    pairs: {{\"{pair}\": {'null' if paper is None else paper}}}\n"
                   f"    min_difference: {'null' if least is None else least}\n"
                   for i, (pair, paper, least) in enumerate(pairs))


def verdicts(tmp_path, h: claims.Hypothesis) -> list[claims.Judged]:
    return claims.judge(h, leaderboard.local_results(tmp_path / "results"))


def test_each_verdict_of_the_rule(tmp_path):
    """up is base + 2 (spread 0.1: interval about [1.75, 2.25]), down base - 2, same base + 0.01, noisy
    base + 1 with a spread of 2 (an interval from about -4 to +6)."""
    cases = [("up > base", None, None, "holds"), ("up > base", 5, None, "smaller than the paper's"),
             ("up > base", 1.5, None, "holds"),  # the paper's 1.5 below the interval: larger, not smaller
             ("down > base", None, None, "opposite"), ("up < base", None, None, "opposite"),
             ("same > base", None, 1, "no effect"), ("same > base", None, None, "not decided"),
             ("noisy > base", None, 1, "not decided"), ("same = base", None, 1, "holds"),
             ("up = base", None, 1, "opposite"), ("noisy = base", None, 1, "not decided"),
             ("same = base", None, None, "not decided")]
    h = made_up(tmp_path, one_pair_claims([c[:3] for c in cases]))
    judged = verdicts(tmp_path, h)
    assert [j.verdict for j in judged] == [c[3] for c in cases]
    up = judged[0].pairs[0]
    assert (up.difference, up.low, up.high) == pytest.approx(seeds.welch(VALUES["up"], VALUES["base"]))
    assert (up.holm_low, up.holm_high, up.level) == pytest.approx((up.low, up.high, 0.95))  # one pair: 95%
    assert 1.7 < up.low < up.high < 2.3 and up.n == (3, 3)


def test_a_pair_whose_sweep_has_not_run_all_its_seeds_is_not_run_yet(tmp_path):
    """A hypothesis committed before its runs: an arm with no runs, or fewer than the sweep's 3 seeds, gives
    'not run yet' whatever the others read, and it is its claim's verdict (the weakest)."""
    h = made_up(tmp_path, one_pair_claims([("up > base", None, None), ("down < base", None, None)]))
    (tmp_path / "results" / "made-up-up-2.json").unlink()  # up: seeds 0 and 1 only
    for seed in range(3):
        (tmp_path / "results" / f"made-up-down-{seed}.json").unlink()
    up, down = verdicts(tmp_path, h)
    assert [up.verdict, down.verdict] == ["not run yet", "not run yet"]
    assert up.pairs[0].n == (2, 3) and down.pairs[0].n == (0, 3) and h.planned["up"] == 3
    assert "-> not run yet" in claims.report(h, [up, down])


def test_a_claim_read_from_a_file_its_script_has_not_written_is_not_run_yet(tmp_path):
    """A hypothesis on a re-evaluation file (`file:`), committed before the runs: no file yet, every pair
    'not run yet' (n 0 of the sweep's 3 seeds); with the file, of 3 seeds an arm, the rule's verdict."""
    made_up(tmp_path, one_pair_claims([("up > base", None, None)]))  # its sweep file; the runs are not read
    folder = tmp_path / "papers" / "made" / "claims"
    (folder / "made-up.hypothesis.yaml").write_text(
        "paper: Made\ntitle: made up\nmetric: accuracy\nfile: made-up.json\narms:\n"
        "  up: {path: \"value/up/*\"}\n  base: {path: \"value/base/*\"}\nclaims:\n"
        + one_pair_claims([("up > base", None, None)]))
    h = claims.load(folder / "made-up.yaml")
    (j,) = verdicts(tmp_path, h)
    assert j.verdict == "not run yet" and j.pairs[0].n == (0, 0) and h.planned == {"up": 3, "base": 3}
    numbers = {arm: dict(zip("012", VALUES[arm])) for arm in ("up", "base")}
    (folder / "made-up.json").write_text(json.dumps({"value": numbers}))
    (j,) = verdicts(tmp_path, h)
    assert j.verdict == "holds" and j.pairs[0].n == (3, 3)


def test_holm_changes_a_borderline_pair(tmp_path):
    """border is base + 0.3 (p 0.021): alone its 95% interval excludes 0; as one of three such pairs of a
    claim its first level is 1 - 0.05/3, whose interval holds 0, and every pair stays there."""
    h = made_up(tmp_path, one_pair_claims([("border > base", None, None)])
                + "  - label: three\n    pairs: {\"border > base\": null, \"border2 > base\": null, "
                  "\"border3 > base\": null}\n    min_difference: null\n")
    alone, three = verdicts(tmp_path, h)
    assert alone.verdict == "holds" and alone.pairs[0].p == pytest.approx(0.0213, abs=1e-3)
    assert three.verdict == "not decided" and [c.verdict for c in three.pairs] == ["not decided"] * 3
    assert [c.level for c in three.pairs] == pytest.approx([1 - 0.05 / 3] * 3)
    assert all(c.low > 0 and c.holm_low < 0 for c in three.pairs)  # 95% excludes 0, Holm's does not
    assert "Holm's correction over its 3 pairs" in claims.report(h, [alone, three])


def test_holm_steps_down_after_a_clear_pair(tmp_path):
    """One clear pair (up, p < 0.001) and one borderline: the clear one at 1 - 0.05/2, the other at 95%."""
    h = made_up(tmp_path, "  - label: two\n    pairs: {\"up > base\": null, \"border > base\": null}\n"
                          "    min_difference: null\n")
    (two,) = verdicts(tmp_path, h)
    assert [c.level for c in two.pairs] == pytest.approx([0.975, 0.95])
    assert two.verdict == "holds"


def test_an_arm_that_names_no_value_of_the_sweep_is_refused(tmp_path):
    h = made_up(tmp_path, one_pair_claims([("up > base", None, None)]))
    text = h.path.with_name("made-up.hypothesis.yaml").read_text().replace("{arm: up}", "{arm: upp}")
    h.path.with_name("made-up.hypothesis.yaml").write_text(text)
    with pytest.raises(ConfigError, match="arm 'up': arm=upp is not among"):
        claims.load(h.path)
    assert claims.main(["verdict"]) == 2


def test_an_arm_may_be_the_runs_of_a_sweep_in_sweeps(tmp_path):
    """Swin's shifted arm is its Fashion-MNIST sweep's runs (sweeps/fashion-mnist-swin.yaml): an arm's
    `sweep:` is found in the claims folder or in sweeps/, and its runs are that sweep's."""
    made_up(tmp_path, one_pair_claims([("up > base", None, None)]))
    folder = tmp_path / "papers" / "made" / "claims"
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "default.yaml").write_text(SWEEP.replace("name: made-up", "name: default-runs"))
    (folder / "made-up.hypothesis.yaml").write_text(
        "paper: Made\ntitle: made up\nmetric: accuracy\narms:\n  default: {sweep: default-runs, arm: up}\n"
        "  base: {arm: base}\nclaims:\n" + one_pair_claims([("default > base", None, None)]))
    h = claims.load(folder / "made-up.yaml")
    (j,) = verdicts(tmp_path, h)
    assert j.verdict == "not run yet" and j.pairs[0].n == (0, 3)  # no run of default-runs yet
    for seed, v in enumerate(VALUES["up"]):
        r = {"run_id": f"default-{seed}", "paper": "lenet", "metric": "accuracy", "final": v,
             "sweep": {"name": "default-runs", "combination": {"paper": "lenet", "arm": "up", "seed": seed}}}
        (tmp_path / "results" / f"default-{seed}.json").write_text(json.dumps(r))
    (j,) = verdicts(tmp_path, h)
    assert j.verdict == "holds" and j.pairs[0].n == (3, 3)
    (tmp_path / "sweeps" / "default.yaml").unlink()
    with pytest.raises(ConfigError, match="no sweep named default-runs beside it nor in sweeps/"):
        claims.load(folder / "made-up.yaml")


@pytest.fixture(scope="module")
def judged():
    return claims.judge_all(claims.sweep_files(), ROOT / "results")


def test_the_transformer_heads_pair_comes_from_results(judged):
    """Issue 43: 4 heads minus 16 heads, +2.81 BLEU [1.26, 4.37] (Welch), a pair --versus never compared."""
    (h, js), = [(h, js) for h, js in judged if h.path.name == "heads.yaml"]
    pair = next(c for j in js for c in j.pairs if str(c.pair) == "4 heads > 16 heads")
    assert (round(pair.difference, 2), round(pair.low, 2), round(pair.high, 2)) == (2.81, 1.26, 4.37)
    assert pair.n == (3, 3) and pair.verdict == "holds"


def test_verdict_all_runs_on_the_committed_results(judged, capsys):
    assert claims.main(["verdict", "--all"]) == 0
    out = capsys.readouterr().out
    for h, js in judged:
        assert str(h.path.relative_to(ROOT)) in out
        assert all(j.verdict in claims.WEAKEST_FIRST and all(c.n[0] >= 3 and c.n[1] >= 3 or c.verdict == "not run yet"
                                                             for c in j.pairs) for j in js)
    assert sum(len(js) for _, js in judged) >= 15


def test_every_claim_file_has_its_hypothesis(judged):
    """Beside every sweep file its hypothesis, with what docs/claims.md asks of it; a smallest difference
    never stated is null and said to be so; labels tell a paper's claims apart."""
    sweeps = claims.sweep_files()
    assert len(sweeps) >= 15 and {h.path for h, _ in judged} == set(sweeps)
    hypotheses = sorted(ROOT.glob("papers/*/claims/*.hypothesis.yaml"))
    assert {claims.hypothesis_file(s) for s in sweeps} == set(hypotheses)
    labels: dict[str, list[str]] = {}
    for h, _ in judged:
        if h.spec.get("part_of"):
            assert (h.path.parent / h.spec["part_of"]).is_file()
            continue
        assert {"paper", "title", "statement", "where", "written", "arms", "claims"} <= set(h.spec), h.path
        assert sum(k in h.spec for k in ("reach", "file")) <= 1 and ("metric" in h.spec or "reach" in h.spec)
        for claim in h.claims:
            assert claim.pairs
            if claim.min_difference is None:
                assert "min_difference" in h.spec.get("stated_after_results", []), h.path
        labels.setdefault(h.paper_dir.name, []).extend(c.label for c in h.claims)
    assert all(len(set(v)) == len(v) for v in labels.values()), labels


def test_the_written_blocks_are_what_the_tool_writes(judged, tmp_path):
    """README's claims table and docs/claims.md's table of pairs: `verdict --all --write` would change
    nothing; a block edited by hand (or left behind by new runs) is found."""
    assert claims.stale(judged) == [], "stale: run python -m common.claims verdict --all --write"
    (tmp_path / "docs").mkdir()
    for name in set(claims.BLOCKS.values()):
        shutil.copy(ROOT / name, tmp_path / name)
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("| not decided |", "| holds |", 1))
    assert claims.stale(judged, tmp_path) == ["README.md"]


def test_notes_and_docs_write_the_tools_verdict(judged):
    """Each note's `**Verdict: ...**` in its claim section, and each paper's entry in docs/claims.md, is
    the tool's verdict text (the prose after it is the note's own)."""
    listing = (ROOT / "docs" / "claims.md").read_text()
    for name, items in claims.by_paper(judged).items():
        expected = claims.paper_verdict(items)
        note = (ROOT / "papers" / name / "README.md").read_text()
        assert claims.written_verdict(note) == expected, f"papers/{name}/README.md"
        entry = re.search(rf"^- \[[^\]]+\]\(\.\./papers/{name}/README\.md#the-claim-tested\)(.*?)(?=^- |\Z)",
                          listing, re.S | re.M)
        assert entry and claims.written_verdict(entry[1]) == expected, f"docs/claims.md, {name}"


def test_a_claim_run_again_on_fashion_mnist_is_set_beside_its_first_verdict(tmp_path):
    """FILE-fashion-mnist.yaml beside FILE.yaml: docs/claims.md's table of what real data changed gives
    each claim's verdict on both and the pairs whose verdict changed; the claims must be in the same order."""
    first = made_up(tmp_path, one_pair_claims([("up > base", None, None), ("down < base", None, None)]))
    folder = first.path.parent
    (folder / "made-up-fashion-mnist.yaml").write_text(SWEEP.replace("name: made-up", "name: made-up-fm"))
    hypothesis = (folder / "made-up.hypothesis.yaml").read_text().replace("{arm: up}", "{arm: noisy}")
    (folder / "made-up-fashion-mnist.hypothesis.yaml").write_text(hypothesis)
    for path in list((tmp_path / "results").glob("made-up-*.json")):
        r = json.loads(path.read_text())
        r["run_id"], r["sweep"]["name"] = "fm-" + r["run_id"], "made-up-fm"
        (tmp_path / "results" / f"{r['run_id']}.json").write_text(json.dumps(r))
    again = claims.load(folder / "made-up-fashion-mnist.yaml")
    judged = [(h, verdicts(tmp_path, h)) for h in (first, again)]
    assert [[j.verdict for j in js] for _, js in judged] == [["holds", "holds"], ["not decided", "holds"]]
    (((h0, _), (h1, _)),) = claims.again_on_real_data(judged)
    assert (h0.path.name, h1.path.name) == ("made-up.yaml", "made-up-fashion-mnist.yaml")
    rows = claims.real_data_table(judged).splitlines()[2:]
    assert len(rows) == 2
    assert "| claim 0 | its data | holds | **not decided** | up > base: holds to not decided |" in rows[0]
    assert "| claim 1 | its data | holds | holds | - |" in rows[1]
    (folder / "made-up-fashion-mnist.hypothesis.yaml").write_text(hypothesis.split("  - label: claim 1")[0])
    again = claims.load(folder / "made-up-fashion-mnist.yaml")
    with pytest.raises(ConfigError, match="1 claims where made-up.yaml has 2"):
        claims.again_on_real_data([judged[0], (again, verdicts(tmp_path, again))])
