"""The output rule every interop verb keeps: no verb replaces a non-empty directory it did not create.

An --out that exists and holds anything is refused unless `overwrite` is given, and one that is or
contains what the verb reads from (the checkpoint or run being exported, the directory or file being
imported) is refused even then: the replacement is renamed into place only when complete, which
would delete the source the moment it succeeded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from groundup.errors import DataError


def check_out_dir(out: str | Path, overwrite: bool = False, sources: Iterable[str | Path] = ()) -> Path:
    out = Path(out)
    target = out.resolve()
    for source in sources:
        source = Path(source).resolve()
        if target == source or target in source.parents:
            raise DataError(f"{out}: it is or contains {source}, which this command reads; choose another --out")
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise DataError(f"{out}: exists and is not a directory")
        if any(out.iterdir()) and not overwrite:
            raise DataError(f"{out}: exists and is not empty; pass --overwrite to replace it")
    return out
