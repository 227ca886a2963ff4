"""The page "Adding a strategy" (docs/adding-a-strategy.md) against the code: the order it gives is the one
`parallelize` applies, the places it names exist, the Trainer and the memory bench call that one function
(and nothing else in common/ wraps a model), and its worked example (--zero2), followed to the letter on a
copy of the repository, adds a strategy that trains one process's weights, changing neither the Trainer
nor the bench.
"""

import ast
import importlib
import re
import shutil
import subprocess
import sys

import pytest

from common import parallelize, step
from tests.conftest import ROOT, launch_env

PAGE = ROOT / "docs" / "adding-a-strategy.md"
TEXT = PAGE.read_text()
COMMON = ROOT / "common"
# how a block of the worked example says where it goes: before or after a line, or a new file
WHERE = re.compile(r"# (?P<path>\S+), (?:(?P<where>before|after): (?P<anchor>.+)|a new file)")


def section(heading: str) -> str:
    return TEXT.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```\w*\n(.*?)```", text, re.S)


def calls(tree: ast.AST) -> list[str]:
    """The names called in a tree (`f(...)`, `x.f(...)`), in the order they appear in the source."""
    found = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    found.sort(key=lambda node: (node.lineno, node.col_offset))
    return [n.func.id if isinstance(n.func, ast.Name) else n.func.attr for n in found
            if isinstance(n.func, (ast.Name, ast.Attribute))]


def function(path, name: str) -> ast.FunctionDef:
    return next(node for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.FunctionDef) and node.name == name)


def test_the_order_on_the_page_is_the_order_parallelize_applies():
    steps = [line.split()[0] for line in code_blocks(section("The one order"))[0].splitlines() if line.strip()]
    assert steps[:2] == ["split_stages", "move"] and "apply_fsdp" in steps
    names = ["to" if s == "move" else s for s in steps]
    for name in names:
        assert name == "to" or callable(getattr(parallelize, name, None)), f"common/parallelize.py has no {name}"
    called = calls(function(COMMON / "parallelize.py", "parallelize"))
    assert [c for c in called if c in names] == names, "parallelize applies its steps in another order than the page"


def test_every_place_the_page_names_exists():
    """In "The places a new strategy touches", each item's files exist and each name it gives is defined in one
    of them (a method of the step classes named as `Whole.forward_backward` would be, or a dotted name)."""
    places = section("The places a new strategy touches")
    items = re.split(r"\n\d\. ", places)[1:]
    assert len(items) == 6
    for item in items:
        paths = re.findall(r"`((?:common|tests)/[\w/]+\.py)`", item)
        assert paths and all((ROOT / p).exists() for p in paths), item
        modules = [importlib.import_module(p[:-3].replace("/", ".")) for p in paths if p.startswith("common/")]
        for name in re.findall(r"`([A-Za-z_][\w.]*)(?:\([^`]*\))?`", item):
            if name.endswith(".py"):
                continue
            assert any(_defined(module, name) for module in modules), f"{name} is in none of {paths}"


def _defined(module, dotted: str) -> bool:
    value = module
    for part in dotted.split("."):
        if not hasattr(value, part):
            return False
        value = getattr(value, part)
    return True


def test_the_step_classes_have_every_method_the_trainer_calls():
    methods = re.findall(r"`(\w+)`", section("The one order").split("calls only their methods", 1)[1].split(")")[0])
    assert len(methods) == 6
    for cls in (step.Whole, step.Pipelined):
        assert all(callable(getattr(cls, m, None)) for m in methods), cls
    trainer = ast.parse((COMMON / "trainer.py").read_text())
    used = {node.attr for node in ast.walk(trainer) if isinstance(node, ast.Attribute)}
    assert "pipeline" not in used, "the Trainer asks for the pipeline: its branches belong in common/step.py"


def test_the_trainer_and_the_memory_bench_call_the_one_parallelize():
    for path in (COMMON / "trainer.py", COMMON / "bench_memory.py"):
        tree = ast.parse(path.read_text())
        imported = {(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for alias in node.names}
        assert ("common.parallelize", "parallelize") in imported and "parallelize" in calls(tree), path.name
    # and nothing else in common/ wraps a model, splits its stages or layers, or checkpoints its blocks
    wrapping = {"fully_shard", "DistributedDataParallel", "DataParallel", "apply_checkpointing", "Pipeline"}
    for path in sorted(COMMON.rglob("*.py")):
        if path.name in ("parallelize.py", "activations.py", "pipeline.py", "tensor_parallel.py", "bench_loop.py"):
            continue  # parallelize.py, the modules whose functions it calls, and the bench's bare PyTorch loop
        tree = ast.parse(path.read_text())
        found = set(calls(tree)) & wrapping
        found |= {f"{n.func.value.id}.{n.func.attr}" for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                  and (n.func.value.id, n.func.attr) in {("pipeline", "split"), ("tensor_parallel", "apply")}}
        assert not found, f"{path.relative_to(ROOT)} calls {sorted(found)} outside common/parallelize.py"


def follow_the_worked_example(repo) -> set[str]:
    """Each block of the worked example, put where its first line says; returns the files changed."""
    changed = set()
    for block in code_blocks(section("A worked example: ZeRO-2 (`--zero2`)")):
        first, body = block.split("\n", 1)
        where = WHERE.fullmatch(first)
        assert where, f"a block of the worked example does not say where it goes: {first}"
        path = repo / where["path"]
        changed.add(where["path"])
        if where["where"] is None:
            assert not path.exists()
            path.write_text(body)
            continue
        lines = path.read_text().splitlines(keepends=True)
        at = [i for i, line in enumerate(lines) if where["anchor"] in line]
        assert len(at) == 1, f"{where['path']} has the line {where['anchor']!r} {len(at)} times, not once"
        indent = re.match(r"\s*", lines[at[0]]).group()
        i = at[0] + (where["where"] == "after")
        lines[i:i] = [indent + line if line.strip() else line for line in body.splitlines(keepends=True)]
        path.write_text("".join(lines))
    return changed


@pytest.mark.slow  # runs trained under torchrun: left out of `-m "not slow"`
def test_the_worked_example_adds_a_strategy_that_trains_one_processs_weights(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".git", ".venv*", "__pycache__", ".pytest_cache",
                                                              "runs", "results", "wandb", "*.onnx"))
    changed = follow_the_worked_example(repo)
    assert changed == {"common/sections.py", "common/mesh.py", "common/parallelize.py", "tests/test_zero2.py"}, \
        "neither the Trainer nor the bench changes"
    env = launch_env() | {"PYTHONPATH": str(repo)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "0",
                           "tests/test_zero2.py"], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    passed = set(re.findall(r"::(\w+) PASSED", done.stdout))
    assert passed == {"test_zero2_trains_the_single_process_weights",
                      "test_zero2_without_fsdp_is_refused_in_one_line"}, done.stdout[-3000:]
