"""Python source code from the running interpreter's standard library.

Test suites and site-packages are skipped: tests are full of deliberately odd code, and
site-packages holds whatever the user installed, which would make the corpus machine-dependent.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path
from typing import Iterator

SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def iter_stdlib_code(root: str | Path | None = None) -> Iterator[dict]:
    """Yield one record per `.py` file, sorted by path so the order is the same on every run."""
    root = Path(root) if root else stdlib_root()
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("test"))
        paths.extend(Path(dirpath) / f for f in filenames if f.endswith(".py") and not f.startswith("test_"))
    for path in sorted(paths):
        rel = path.relative_to(root).as_posix()
        text = path.read_bytes().decode("utf-8", errors="replace").replace("\r\n", "\n")
        if not text.strip():
            continue
        yield {"id": f"stdlib/{rel}", "source": "python-stdlib", "domain": "code", "text": text,
               "language": "python"}
