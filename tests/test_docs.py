"""The documentation cannot rot: README stays a short front door, every relative link and #anchor of
README.md, docs/ and the paper notes leads somewhere, every block the leaderboard writes is what it
writes from results/ today, the site builds with `mkdocs build --strict`, and nothing of the long
README that docs/ came from was lost."""

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from common import docs, leaderboard
from tests.conftest import ROOT

PAGES = docs.pages()
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def test_readme_is_a_short_front_door():
    text = README.read_text()
    assert len(text.encode()) < 15_000, "README.md is the front door: move the detail into docs/"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pytest -q" in ci and "pip install -r requirements.txt && python -m pytest -q" in text
    for heading in ("## Quick start", "## Papers", "### The claims tested so far"):
        assert f"\n{heading}\n" in text
    for note in docs.paper_notes():
        assert f"]({note.relative_to(ROOT)})" in text, f"the papers table lacks {note.parent.name}"
    assert text.count(leaderboard.START) == 1 and "mkdocs serve" in text and "](docs/README.md)" in text


def test_every_docs_page_is_in_the_index_and_in_the_sites_nav():
    index = (ROOT / "docs" / "README.md").read_text()
    nav_text = "nav:" + (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]  # the rest holds a python tag
    nav = yaml.safe_load(nav_text)["nav"]
    in_nav = {page for section in nav for entry in section.values() for page in
              (entry if isinstance(entry, list) else [entry])}
    for page in DOCS:
        assert page.name == "README.md" or f"]({page.name})" in index, f"docs/README.md does not link {page.name}"
        assert f"docs/{page.name}" in in_nav, f"mkdocs.yml's nav lacks docs/{page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    assert docs.broken_links(page) == []


def test_the_link_checker_reports_a_broken_link_and_a_broken_anchor(tmp_path):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")  # the page with its neighbours, outside the repository
    shutil.copy(README, tmp_path)
    copy = tmp_path / "docs" / "performance.md"
    text = copy.read_text()
    good = "](strategies.md#activation-checkpointing)"
    assert good in text and docs.broken_links(copy) == []
    copy.write_text(text.replace(good, "](strategies.md#activation-checkpoints)", 1))
    assert docs.broken_links(copy) == ["strategies.md#activation-checkpoints: no heading #activation-checkpoints "
                                       "in strategies.md"]
    copy.write_text(text.replace(good, "](strategy.md#activation-checkpointing)", 1))
    assert docs.broken_links(copy) == ["strategy.md#activation-checkpointing: no such file"]


def test_anchors_follow_githubs_rules():
    text = "# Language models: GPT on Python's documentation\n## `--ac` and faster_rcnn\n## Notes\n## Notes\n" \
           "```\n# not a heading\n```\n"
    assert len(docs.links(README.read_text())) > 30, "README's links are found"
    assert docs.anchors(text) == {"language-models-gpt-on-pythons-documentation", "--ac-and-faster_rcnn",
                                  "notes", "notes-1"}
    assert docs.links("[a](b.md#c) `[no](code.md)` [web](https://x.org) ![img](d.png)") == ["b.md#c", "d.png"]


def writing_commands(page):
    """The `python -m common.leaderboard ... --write FILE` commands a page gives; a note's own table,
    when the note names no command, by the one docs/adding-a-paper.md gives."""
    text = page.read_text()
    commands = [shlex.split(c) for c in re.findall(r"python -m common\.leaderboard ([^`\n]*--write [^`\n#]*)", text)]
    if page.parent.parent.name == "papers" and leaderboard.START in text and not any(
            "--sweep" not in c for c in commands):
        name = page.parent.name
        commands.append(["--paper", name, "--format", "markdown", "--write", f"papers/{name}/README.md"])
    return commands


def test_every_block_the_leaderboard_writes_is_up_to_date(tmp_path, monkeypatch, capsys):
    store = functools.lru_cache(leaderboard.local_results)
    monkeypatch.setattr(leaderboard, "local_results", lambda folder: store(str(folder)))
    written = set()
    for page in PAGES:
        for argv in writing_commands(page):
            i = argv.index("--write")
            target, copy = ROOT / argv[i + 1], tmp_path / "page.md"
            shutil.copy(target, copy)
            into_copy = ["--results-dir", str(ROOT / "results")] + argv[:i + 1] + [str(copy)] + argv[i + 2:]
            assert leaderboard.main(into_copy) == 0, capsys.readouterr().err
            assert copy.read_text() == target.read_text(), f"stale: {' '.join(argv)} changes {argv[i + 1]}"
            written.add((argv[i + 1], argv[argv.index("--sweep") + 1] if "--sweep" in argv else None))
    for page in [README, *DOCS]:  # each block of README and docs/ has its command beside it
        for name in re.findall(r"<!-- leaderboard:(?:(\S+):)?start -->", docs.prose(page.read_text())):
            assert (str(page.relative_to(ROOT)), name or None) in written, f"{page.name}: who writes block {name}?"


def test_the_site_builds_strictly(tmp_path):
    site = tmp_path / "site"
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2.0
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    home = (site / "index.html").read_text()
    for note in docs.paper_notes():
        assert (site / note.parent.relative_to(ROOT) / "index.html").exists()
        assert f'href="{note.parent.relative_to(ROOT)}/"' in home, f"no {note.parent.name} in the nav"
    assert (site / "docs" / "leaderboard" / "index.html").exists()
    assert (site / "papers" / "alexnet" / "claims" / "relu-vs-tanh.png").exists(), "a note's figure"
    assert (site / "docs" / "lineage-shapes.png").exists() and "mathjax" in home.lower()


OLD_README = "ed608b7"  # the last commit whose README held everything
EDITS = {  # what moving it changed, besides link targets and heading levels
    "--write README.md": "--write docs/leaderboard.md",
    "the leaderboard below shows its best seed": "the [leaderboard] shows its best seed",
    "first command reached": "first command of the [Quick start] reached",
}


def normal(text):
    """Link targets dropped, headings' levels dropped, lines joined."""
    text = re.sub(r"\]\([^)\s]*\)", "]", text)
    return re.sub(r"(?m)^#{1,6} ", "", text)


def test_nothing_of_the_old_readme_was_lost():
    shown = subprocess.run(["git", "show", f"{OLD_README}:README.md"], cwd=ROOT, capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"commit {OLD_README} is not in this clone's history")
    old = normal(shown.stdout)
    for before, after in EDITS.items():
        old = old.replace(before, after)
    new = " ".join(" ".join(normal(p.read_text()) for p in [README, *DOCS]).split())
    lost = [chunk for chunk in re.split(r"\n\s*\n", old) if " ".join(chunk.split()) not in new]
    assert not lost, f"{len(lost)} paragraphs, tables or code blocks of the old README are nowhere now: {lost[:2]}"
