"""Every command the documentation shows parses with its tool's own argument parser.

The commands are the lines of fenced code blocks in README.md, docs/**/*.md and papers/*/README.md that
run `python train.py`, `torchrun ... train.py` (torchrun's own flags dropped) or `python -m common.X` /
`python -m papers.X` (a `\\` continuation joined to its line, a `# comment` dropped, a prefix such as
`/usr/bin/time -v` or `pip install ... &&` passed over). Each is parsed by the tool's `build_parser()`,
never run, so that a renamed or removed flag fails here with the file and line that still use it.
"""

import contextlib
import importlib
import io
import itertools
import re
import shlex
from pathlib import Path

import pytest

from common.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent

# Notation in a command: `[--flag VALUE]` is checked as if given, a lone `...` (more flags) is dropped, and
# `{a,b,c}` as a whole word is checked with each value (a shard pattern 'train-{000000..000099}.tar' is a
# real value). A command holding a $VARIABLE, a <placeholder> or an elided `word...` cannot be parsed: it
# is passed over, and test_every_documented_command_parses names each one.
UNPARSABLE = re.compile(r"\$|<\w[\w-]*>|.\.\.\.|\.\.\..")
ALTERNATIVES = re.compile(r"^\{(\w[\w-]*(?:,\w[\w-]*)+)\}$")
SEPARATORS = {"&&", "||", ";", "|", "&"}
WRAPPERS = {"time", "/usr/bin/time", "-v"}  # before the command, as in `/usr/bin/time -v python ...`


def doc_files(root: Path) -> list[Path]:
    docs = sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else []
    return [root / "README.md", *docs, *sorted(root.glob("papers/*/README.md"))]


def fenced_lines(path: Path):
    """(line number, text) of each logical line inside ``` blocks, `\\` continuations joined."""
    inside, pending, start = False, "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""


def command_of(words: list[str]) -> tuple[str, list[str]] | None:
    """(module, arguments) of a train.py or `python -m common.X` command; None for any other command."""
    while words and (words[0] in WRAPPERS or re.match(r"\w+=", words[0])):  # a wrapper, an environment variable
        words = words[1:]
    if words[:1] == ["torchrun"]:
        script = next((i for i, word in enumerate(words) if word.endswith("train.py")), None)
        return None if script is None else ("train", words[script + 1:])
    if words[:1] in (["python"], ["python3"]) and len(words) > 1:
        if words[1].endswith("train.py"):
            return "train", words[2:]
        if words[1] == "-m" and len(words) > 2 and words[2].startswith(("common.", "papers.")):
            return words[2], words[3:]
    return None


def spelled_out(words: list[str]) -> list[list[str]]:
    """The argument lists a line of notation stands for: [optional] words given, `...` dropped, one list per
    value of each {a,b,c}."""
    plain, optional = [], False
    for word in words:
        if word == "...":
            continue
        if word.startswith("["):
            word, optional = word[1:], True
        if optional and word.endswith("]"):
            word, optional = word[:-1], False
        plain.append(ALTERNATIVES.sub(r"\1", word).split(",") if ALTERNATIVES.match(word) else [word])
    return [list(args) for args in itertools.product(*plain)]


def doc_commands(root: Path = ROOT) -> tuple[list, list]:
    """([(file, line, module, args, text)], [(file, line, text)]): the commands, and those passed over as
    notation. A line that shlex cannot split is a command with no module (a broken one)."""
    commands, skipped = [], []
    for path in doc_files(root):
        for number, text in fenced_lines(path):
            text = text.strip().removeprefix("$ ")  # a prompt
            where = path.relative_to(root)
            try:
                words = shlex.split(text, comments=True)
            except ValueError as e:
                if re.match(r"(python3? |torchrun )", text):
                    commands.append((where, number, None, str(e), text))
                continue
            segments = [[]]
            for word in words:
                segments.append([]) if word in SEPARATORS else segments[-1].append(word)
            for segment in segments:
                found = command_of(segment)
                if found and any(UNPARSABLE.search(word) for word in found[1]):
                    skipped.append((where, number, text))
                elif found:
                    commands += [(where, number, found[0], args, text) for args in spelled_out(found[1])]
    return commands, skipped


def parse_error(module: str, args: list[str]) -> str | None:
    """None if `args` parse with the module's build_parser(), else argparse's message."""
    if module is None:
        return f"shlex cannot split it: {args}"
    name = "common.config" if module == "train" else module
    try:
        parser = importlib.import_module(name).build_parser()
    except ModuleNotFoundError as e:
        return f"no such tool: {e}"
    except AttributeError:
        return f"{name} has no build_parser() to parse its command line with"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except ConfigError as e:  # train.py's parser: one line, no usage block
        return str(e)
    except SystemExit as e:
        if e.code:  # --help exits 0
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
    return None


def broken(root: Path = ROOT) -> list[str]:
    return [f"{where}:{line}: {text}\n    {message}" for where, line, module, args, text in doc_commands(root)[0]
            if (message := parse_error(module, args))]


# The documented commands that cannot be parsed (see UNPARSABLE), by their text: a new one fails the test
# below, to be written out in full or, if it must stay notation, added here.
PASSED_OVER = {
    "torchrun --nproc_per_node 4 train.py $ARGS --time-limit 03:58:00 &",  # a job script's line
}


def test_every_documented_command_parses():
    commands, skipped = doc_commands()
    assert len(commands) > 50, f"only {len(commands)} commands found: is the collector still reading the docs?"
    assert {c[2] for c in commands} >= {"train", "common.leaderboard", "common.sweep"}
    unexpected = [f"{where}:{line}: {text}" for where, line, text in skipped if text not in PASSED_OVER]
    assert not unexpected, "documented commands that cannot be parsed (write them out, or see PASSED_OVER):\n" + \
        "\n".join(unexpected)
    errors = broken()
    assert not errors, f"{len(errors)} documented command(s) no longer parse:\n" + "\n".join(errors)


def test_a_broken_command_is_reported_with_its_file_and_line(tmp_path):
    (tmp_path / "README.md").write_text("# Title\n\n```bash\npython train.py --paper vit --epochs 3\n"
                                        "torchrun --nproc_per_node 2 train.py --paper vit \\\n"
                                        "    --made-up-flag 3   # a comment\n```\n")
    (tmp_path / "papers" / "x").mkdir(parents=True)
    (tmp_path / "papers" / "x" / "README.md").write_text(
        "```\npip install -r requirements.txt && python -m common.leaderboard --format nope\n"
        "/usr/bin/time -v python -m common.sweep sweeps/a.yaml --parallel 2\n"
        "python train.py --paper vit [--flavor tiny] [--ac {none,full}] ...\n"
        "python train.py --paper vit --epochs 'three\n"
        "python -m common.renamed_tool --flag\n```\n"
        "Outside a block: python train.py --not-checked\n")
    commands, skipped = doc_commands(tmp_path)
    assert [(str(w), n, args) for w, n, _, args, _ in commands][2:] == [
        ("papers/x/README.md", 2, ["--format", "nope"]),
        ("papers/x/README.md", 3, ["sweeps/a.yaml", "--parallel", "2"]),
        ("papers/x/README.md", 4, ["--paper", "vit", "--flavor", "tiny", "--ac", "none"]),
        ("papers/x/README.md", 4, ["--paper", "vit", "--flavor", "tiny", "--ac", "full"]),
        ("papers/x/README.md", 5, "No closing quotation"),
        ("papers/x/README.md", 6, ["--flag"])]
    assert commands[1][:4] == (Path("README.md"), 5, "train", ["--paper", "vit", "--made-up-flag", "3"])
    assert skipped == []
    errors = broken(tmp_path)
    assert len(errors) == 4
    assert errors[0].startswith("README.md:5: torchrun") and "--made-up-flag" in errors[0]
    assert errors[1].startswith("papers/x/README.md:2: pip install") and "nope" in errors[1]
    assert errors[2].startswith("papers/x/README.md:5: python train.py") and "shlex" in errors[2]
    assert errors[3].startswith("papers/x/README.md:6: python -m common.renamed_tool") and "no such tool" in errors[3]


@pytest.mark.parametrize("text", ["python train.py --resume $RUN", "python train.py --paper <name>",
                                  "python train.py --resume runs/vit-..."])
def test_what_cannot_be_parsed_is_passed_over(tmp_path, text):
    (tmp_path / "README.md").write_text(f"```\n{text}\n```\n")
    assert doc_commands(tmp_path) == ([], [(Path("README.md"), 2, text)])
