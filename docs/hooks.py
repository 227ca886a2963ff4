"""mkdocs hook: the site's pages are the repository's own files at their own paths, so that a link
reads the same on GitHub and on the site.

README.md is the home page, docs/*.md the documentation, papers/<name>/README.md each paper's note
(in the registry's order under "Papers", so that a new paper needs no line here), and every file
that a page links to (a figure, a sweep file, model.py) is carried beside them.

Each figure of a page links to its own file, to be seen at its full size (GitHub does the same). And a
sweep file opens as text under `mkdocs serve`: serve types a file by Python's mimetypes, which knows no
.yaml and made the browser download one (application/octet-stream).
"""

import mimetypes
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from common.docs import linked_files, paper_notes, pages  # noqa: E402

for suffix in (".yaml", ".yml"):
    mimetypes.add_type("text/plain", suffix)

IMAGE = re.compile(r'<a\b.*?</a>|<img\b[^>]*?\bsrc="([^"]+)"[^>]*>', re.S)  # a link (kept as it is) or an image


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


def on_page_content(html, page, config, files):
    """Every image not already inside a link becomes a link to its own file."""
    return IMAGE.sub(lambda m: f'<a href="{m.group(1)}">{m.group(0)}</a>' if m.group(1) else m.group(0), html)
