"""The shape of the code: no import circles among common/'s modules, a trainer whose steps are
short enough to read at a glance, and no function of common/ longer than a screen."""

import ast
from pathlib import Path

from tests.conftest import ROOT

COMMON = ROOT / "common"
LONGEST_TRAINER_FUNCTION = 60  # lines, docstring included
LONGEST_FUNCTION = 60  # lines, docstring included, of any function of common/ but the bench's rows


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project modules a file imports anywhere in it (inside functions too): `import a.b`,
    `from a import b` (b a module, or a name of module a), `from a.b import c`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
    return found & known


def import_graph(folder: Path) -> dict[str, set[str]]:
    files = {module_name(p): p for p in folder.rglob("*.py")}
    return {name: imported_modules(path, set(files)) - {name} for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, each as the path that closes it."""
    found, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for other in sorted(graph[node]):
            visit(other, path + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_among_common_modules():
    graph = import_graph(COMMON)
    assert "common.errors" in graph["common.config"] and "common.errors" in graph["common.data.vision"]
    assert cycles(graph) == []


def test_no_function_of_the_trainer_is_longer_than_a_screen():
    tree = ast.parse((COMMON / "trainer.py").read_text())
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    lengths = {f.name: f.end_lineno - f.lineno + 1 for f in functions}
    assert {"train_step", "evaluate", "save", "resume", "finish"} <= set(lengths), "the Trainer's steps"
    too_long = {name: n for name, n in lengths.items() if n > LONGEST_TRAINER_FUNCTION}
    assert not too_long, f"longer than {LONGEST_TRAINER_FUNCTION} lines: {too_long}"


def test_no_function_of_common_is_longer_than_a_screen():
    """The bench's row functions (common/bench*.py, `row_*`: one comparison each, read top to bottom) excepted;
    and validate a short sequence that asks each concern (the checks live beside their features)."""
    too_long, validate = {}, None
    for path in sorted(COMMON.rglob("*.py")):
        for f in ast.walk(ast.parse(path.read_text())):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = f.end_lineno - f.lineno + 1
            validate = lines if (path.name, f.name) == ("config.py", "validate") else validate
            bench_row = path.name.startswith("bench") and f.name.startswith("row_")
            if lines > LONGEST_FUNCTION and not bench_row:
                too_long[f"{path.relative_to(ROOT)}:{f.lineno} {f.name}"] = lines
    assert not too_long, f"longer than {LONGEST_FUNCTION} lines: {too_long}"
    assert validate is not None and validate < 30


def test_every_attribute_of_the_trainer_is_first_set_in_init():
    """What a Trainer holds is read in one place: `__init__` sets each attribute (None or a default where a
    later step builds it), and its training state is a TrainState, not a dict."""
    tree = ast.parse((COMMON / "trainer.py").read_text())
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    first = {}
    for f in trainer.body:
        if isinstance(f, ast.FunctionDef):
            for n in ast.walk(f):
                if (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                        and n.value.id == "self"):
                    first.setdefault(n.attr, f.name)
    assert {"state", "optimizer", "progress", "tracker"} <= set(first)
    assert {name: f for name, f in first.items() if f != "__init__"} == {}
