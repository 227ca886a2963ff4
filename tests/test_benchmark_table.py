"""docs/fashion-mnist.md's table of results is computed: it is what `python -m common.benchmark_table
--write` writes from results/ today, a made-up store gives the row the page's format says (mean ± std,
Student's interval, each seed in seed order, wall and samples/s), a sweep still running says how many
seeds have landed, and a default sweep of a paper the table has no row for is refused."""

import pytest
import yaml

from common import benchmark_table, leaderboard
from common.errors import ConfigError
from tests.conftest import ROOT

SWEEP = {"name": "fashion-mnist-resnet", "parameters": {"paper": {"value": "resnet"}, "seed": {"values": [0, 1, 2]}}}


def run(seed: int, final: float, wall: float, speed: float) -> dict:
    return {"run_id": f"r{seed}", "flavor": "tiny", "params": 297450, "epochs": 12, "final": final, "wall_s": wall,
            "samples_per_s": speed, "sweep": {"name": "fashion-mnist-resnet", "combination": {"seed": seed}}}


def test_the_page_table_is_what_the_tool_writes():
    results = leaderboard.local_results(ROOT / "results")
    assert not benchmark_table.stale(results), "stale: run python -m common.benchmark_table --write"
    text = benchmark_table.table(results)
    assert text.count("\n| ") == len(list((ROOT / "sweeps").glob("fashion-mnist-*.yaml")))
    assert "| ResNet (tiny, 297,450 parameters, 12 epochs) | 0.9333 ± 0.0010 | [0.9309, 0.9357] |" in text


def test_a_row_from_a_made_up_store():
    runs = [run(2, 0.93, 4000.4, 190.2), run(0, 0.92, 2000.0, 380.0), run(1, 0.94, 2300.0, 360.0)]
    row = benchmark_table.row("resnet", SWEEP, runs)
    # mean 0.93, std 0.01, t(0.975, 2) = 4.303: half-width 0.0248
    assert row == ("| ResNet (tiny, 297,450 parameters, 12 epochs) | 0.9300 ± 0.0100 | [0.9052, 0.9548] "
                   "| 0.9200, 0.9400, 0.9300 | 2,767 s (2,000 / 2,300 / 4,000) | 310 (380 / 360 / 190) "
                   "| ResNet18 0.949 |")
    assert "| 0.9200 (1 of 3 seeds so far) | n/a | 0.9200 |" in benchmark_table.row("resnet", SWEEP, runs[1:2])
    assert benchmark_table.row("resnet", SWEEP, []).startswith("| ResNet | not run yet (`sweeps/fashion-mnist-resnet")


def test_a_default_sweep_of_an_unknown_paper_is_refused(tmp_path):
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "fashion-mnist-resnet.yaml").write_text(yaml.safe_dump(SWEEP))
    assert [p.name for p in benchmark_table.sweep_files(tmp_path)] == ["fashion-mnist-resnet.yaml"]
    (tmp_path / "sweeps" / "fashion-mnist-mlp.yaml").write_text(yaml.safe_dump(SWEEP | {"name": "fashion-mnist-mlp"}))
    with pytest.raises(ConfigError, match="fashion-mnist-mlp.yaml: no row of the published table is named for 'mlp'"):
        benchmark_table.sweep_files(tmp_path)
