"""What `train.py --list` prints, kept beside the registry so that listing the papers imports none.

papers/catalog.json holds each paper's name, family, year, title and flavors, in the registry's
order. It is written from the papers themselves by

    python -m papers.catalog

after a paper or a flavor is added; a test (tests/test_startup.py) fails, naming this command, when
the file and the papers disagree. The same command writes the table of docs/papers.md (a paper a row, with its
flavors); `python -m papers.catalog --markdown` prints that table alone.
"""

import argparse
import json
import sys
from pathlib import Path

PATH = Path(__file__).with_name("catalog.json")
PAGE = Path(__file__).parent.parent / "docs" / "papers.md"
START, END = "<!-- catalog:start -->", "<!-- catalog:end -->"


def build() -> list[dict]:
    """The catalog from the papers' specs (imports every paper)."""
    from papers import PAPER_FOLDERS, get_paper

    return [{"name": spec.name, "family": spec.family, "year": spec.year, "title": spec.title,
             "flavors": list(spec.flavors)} for spec in map(get_paper, PAPER_FOLDERS)]


def read() -> list[dict]:
    """The catalog as written (imports nothing)."""
    return json.loads(PATH.read_text())


def markdown(papers: list[dict] | None = None) -> str:
    """docs/papers.md's table: a paper a row, linked to its note, with its flavors."""
    rows = ["| name | family | year | flavors | title |", "|---|---|---|---|---|"]
    rows += [f"| [{p['name']}](../papers/{p['name']}/README.md) | {p['family']} | {p['year']} | "
             f"{', '.join(p['flavors'])} | {p['title']} |" for p in (papers if papers is not None else read())]
    return "\n".join(rows) + "\n"


def write_page() -> None:
    """Replace the table between docs/papers.md's catalog markers."""
    text = PAGE.read_text()
    head, rest = text.split(START, 1)
    PAGE.write_text(f"{head}{START}\n{markdown()}{END}{rest.split(END, 1)[1]}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m papers.catalog", description=__doc__.split("\n\n")[0])
    p.add_argument("--markdown", action="store_true", help="print docs/papers.md's table, write nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    if build_parser().parse_args(argv).markdown:
        print(markdown(), end="")
        return 0
    PATH.write_text("[\n" + ",\n".join(json.dumps(paper) for paper in build()) + "\n]\n")  # a paper a line
    write_page()
    print(f"wrote {PATH} and the table of {PAGE.name} ({len(read())} papers)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
