"""The documentation's pages, their relative links and their headings' anchors, read as GitHub reads them.

The pages are README.md, docs/*.md and every paper's note (papers/<name>/README.md). tests/test_docs.py
checks that every relative link among them resolves; docs/hooks.py makes them the site's pages, at
their own paths, with the files they link to.
"""

import ast
import re
from pathlib import Path
from urllib.parse import unquote

from common.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.M | re.S)  # indented too, as in a list item
CODE_SPAN = re.compile(r"``.+?``|`[^`]+`", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", re.M)


def paper_notes(root: Path = ROOT) -> list[Path]:
    """Every paper's note, in the registry's order (PAPER_FOLDERS), then any other folder's."""
    tree = ast.parse((root / "papers" / "__init__.py").read_text())
    order = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "PAPER_FOLDERS" for t in node.targets))
    notes = sorted((root / "papers").glob("*/README.md"), key=lambda p: p.parent.name)
    rank = {name: i for i, name in enumerate(order)}
    return sorted(notes, key=lambda p: rank.get(p.parent.name, len(rank)))


def pages(root: Path = ROOT) -> list[Path]:
    """README.md, the docs/ pages and the paper notes."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), *paper_notes(root)]


def _blank(match: re.Match) -> str:
    return "\n" * match.group(0).count("\n")  # keeps the line count


def prose(text: str) -> str:
    """The text without its fenced blocks and code spans: what holds links and headings."""
    return CODE_SPAN.sub(lambda m: " " + _blank(m), FENCE.sub(_blank, text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text lowercased, punctuation but '-' and '_' dropped, each
    space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub(_blank, text)):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(text: str) -> list[str]:
    """The relative link and image targets of a page (web and mail addresses left out)."""
    targets = LINK.findall(prose(text))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


def broken_links(page: Path) -> list[str]:
    """Each link of the page that leads nowhere: a missing file, or an anchor that is no heading."""
    text = page.read_text()
    broken = []
    for target in links(text):
        path, _, anchor = unquote(target).partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix != ".md":
            broken.append(f"{target}: an anchor into a file that is not markdown")
        elif anchor and anchor not in anchors(where.read_text() if path else text):
            broken.append(f"{target}: no heading #{anchor} in {where.name}")
    return broken


def linked_files(page: Path, root: Path = ROOT) -> set[Path]:
    """The repository's files that a page links to (for the site to carry them beside the pages)."""
    found = set()
    for target in links(page.read_text()):
        path = unquote(target).partition("#")[0]
        where = (page.parent / path).resolve() if path else None
        if where and where.is_file() and where.is_relative_to(root.resolve()):
            found.add(where)
    return found


def replace_between(content: str, start: str, end: str, text: str, where: object = "the file") -> str:
    """`content` with what stands between its lines `start` and `end` replaced by `text`; the rest is kept
    byte for byte. A ConfigError naming `where` unless each line is there once, in that order."""
    if content.count(start) != 1 or content.count(end) != 1 or content.index(start) > content.index(end):
        raise ConfigError(f"{where} needs one '{start}' line and, after it, one '{end}' line")
    head, rest = content.split(start, 1)
    return f"{head}{start}\n{text.rstrip()}\n{end}{rest.split(end, 1)[1]}"
