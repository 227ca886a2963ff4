"""The steps of "Adding a paper" (docs/adding-a-paper.md), followed to the letter on a copy of the repository.

The worked example in tests/example_paper/ (All-CNN: convolutions only, one input size, no batch
norm, no mask code) becomes papers/allconv/, the registry gets its one line, and then, with nothing
else changed, the registry-wide tests cover it and `torchrun --nproc_per_node 2 train.py --paper
allconv` trains it.
"""

import pytest

import re
import shutil
import subprocess
import sys

from tests.conftest import ROOT, launch_env, load_json, torchrun_command

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

EXAMPLE = ROOT / "tests" / "example_paper"
REGISTRY_WIDE = ["tests/test_papers.py", "tests/test_export.py", "tests/test_variable.py"]


def follow_the_readme(repo) -> None:
    """Steps 1 to 4: the paper's folder (model.py, __init__.py, README.md) and one registry line."""
    folder = repo / "papers" / "allconv"
    folder.mkdir()
    for name in ("model.py", "__init__.py", "README.md"):
        shutil.copy(EXAMPLE / name, folder / name)
    registry = repo / "papers" / "__init__.py"
    text, added = re.subn(r'(PAPER_FOLDERS = \((?:\n    "\w+",)+)', r'\1\n    "allconv",', registry.read_text())
    assert added == 1, "the registry line is not where docs/adding-a-paper.md says"
    registry.write_text(text)


def test_a_paper_written_from_the_readme_alone_is_covered_by_the_registry_wide_tests_and_trains(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".git", ".venv*", "__pycache__", ".pytest_cache",
                                                              "runs", "results", "wandb", "*.onnx"))
    follow_the_readme(repo)
    env = launch_env() | {"PYTHONPATH": str(repo)}

    tests = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "0", "-k", "allconv",
                            *REGISTRY_WIDE], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    passed = set(re.findall(r"::(\w+)\[allconv\] PASSED", tests.stdout))
    assert passed == {"test_spec_is_complete", "test_every_flavor_builds_on_meta",
                      "test_forward_shape_no_nan_and_every_parameter_gets_a_gradient",
                      "test_compile_runs_and_matches_eager",
                      "test_it_fits_a_small_fixed_batch_at_its_own_learning_rate",
                      "test_every_paper_exports_and_onnxruntime_agrees"}, tests.stdout[-3000:]

    run = subprocess.run([*torchrun_command(2), str(repo / "train.py"), "--paper", "allconv", "--wandb", "disabled"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = load_json(next((tmp_path / "runs").iterdir()) / "result.json")
    assert (result["paper"], result["strategy"], result["world_size"]) == ("allconv", "ddp", 2)
    # 10 classes: chance is 0.1. The same commit ends at 0.7778 on this machine's CPU and above 0.8 on an
    # earlier one (float rounding of other kernels): the bar is that it learns, not a decimal of the CPU
    assert result["final"] >= 0.7
