"""mkdocs hook: the site's pages are the repository's own files at their own paths, so that a link
reads the same on GitHub and on the site.

README.md is the home page, docs/*.md the documentation, papers/<name>/README.md each paper's note
(in the registry's order under "Papers", so that a new paper needs no line here), and every file
that a page links to (a figure, a sweep file, model.py) is carried beside them.
"""

import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from common.docs import linked_files, paper_notes, pages  # noqa: E402


def on_config(config):
    config.nav.append({"Papers": [str(p.relative_to(ROOT)) for p in paper_notes(ROOT)]})
    return config


def on_files(files, config):
    for file in [f for f in files if Path(f.src_dir) == Path(config.docs_dir)]:
        files.remove(file)  # docs/ is added again below at its repository path
    assets = {p for p in (ROOT / "docs").iterdir() if p.is_file() and p.suffix not in (".md", ".py")}
    found = set(pages(ROOT)) | assets | {f for page in pages(ROOT) for f in linked_files(page, ROOT)}
    for path in sorted(found):
        files.append(File(str(path.relative_to(ROOT)), str(ROOT), config.site_dir, config.use_directory_urls))
    return files
