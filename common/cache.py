"""The repository's cache folder: what is slow to make and the same every time (a data set's split,
files decompressed for a reader), kept between runs.

`$PAPER_STUDY_CACHE`, or `paper-study` under `$XDG_CACHE_HOME` (default `~/.cache`). Nothing in it
is needed: deleting it costs the next run the time to make it again.
"""

import os
import tempfile
from pathlib import Path


CACHE_VARIABLE = "PAPER_STUDY_CACHE"


def cache_dir() -> Path:
    """The cache folder (not created here)."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "paper-study"


def write_atomically(path: Path, write) -> bool:
    """Write a file through `write(file object)` into a temporary file beside it, then rename it into
    place, so that processes writing it at once (the ranks of a launch) never leave a partial file.
    Returns False, writing nothing, where the folder cannot be written (the cache is then skipped)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as f:
            write(f)
        os.replace(f.name, path)
        return True
    except OSError:
        return False
