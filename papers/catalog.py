"""What `train.py --list` prints, kept beside the registry so that listing the papers imports none.

papers/catalog.json holds each paper's name, family, year, title and flavors, in the registry's
order. It is written from the papers themselves by

    python -m papers.catalog

after a paper or a flavor is added; a test (tests/test_papers.py) fails, naming this command, when
the file and the papers disagree.
"""

import json
import sys
from pathlib import Path

PATH = Path(__file__).with_name("catalog.json")


def build() -> list[dict]:
    """The catalog from the papers' specs (imports every paper)."""
    from papers import PAPER_FOLDERS, get_paper

    return [{"name": spec.name, "family": spec.family, "year": spec.year, "title": spec.title,
             "flavors": list(spec.flavors)} for spec in map(get_paper, PAPER_FOLDERS)]


def read() -> list[dict]:
    """The catalog as written (imports nothing)."""
    return json.loads(PATH.read_text())


def main() -> int:
    PATH.write_text("[\n" + ",\n".join(json.dumps(paper) for paper in build()) + "\n]\n")  # a paper a line
    print(f"wrote {PATH} ({len(read())} papers)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
