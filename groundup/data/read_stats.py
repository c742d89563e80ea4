"""ReadStats: what reading inputs saw, counted. Every reader fills one; a Ray task's travels as `to_dict()`
and merges into the driver's; reports and summaries read it.

Kept apart from readers.py (which re-exports it) so the counting rules sit in one short file.
"""

from __future__ import annotations

import dataclasses

from groundup.data.web.warc import WarcStats

MAX_PROBLEMS = 10  # how many file:line positions each problem kind keeps for the report
PROBLEM_KINDS = ("bad_json", "invalid_utf8", "binary_files", "no_text", "too_long", "unsupported_files", "bad_field",
                 "unreadable_files")


@dataclasses.dataclass
class ReadStats:
    """What reading saw: counts, plus the first few `file:line: reason` positions of each problem."""

    files: int = 0
    records: int = 0
    bytes: int = 0
    bad_json: int = 0
    bad_json_examples: list[str] = dataclasses.field(default_factory=list)
    invalid_utf8: int = 0  # records decoded with U+FFFD replacement characters
    invalid_utf8_examples: list[str] = dataclasses.field(default_factory=list)
    binary_files: int = 0
    binary_examples: list[str] = dataclasses.field(default_factory=list)
    no_text: int = 0  # records without a string `text` field
    no_text_examples: list[str] = dataclasses.field(default_factory=list)
    too_long: int = 0  # lines or files over `max_record_bytes`, skipped without being held in memory
    too_long_examples: list[str] = dataclasses.field(default_factory=list)
    unsupported_files: int = 0  # files in a directory with an extension no reader handles
    unsupported_examples: list[str] = dataclasses.field(default_factory=list)
    bad_field: int = 0  # records whose id, source, domain, url or language is not a string
    bad_field_examples: list[str] = dataclasses.field(default_factory=list)
    unreadable_files: int = 0  # files that could not be opened or read to the end (the reason is kept)
    unreadable_examples: list[str] = dataclasses.field(default_factory=list)
    crawl: WarcStats = dataclasses.field(default_factory=WarcStats)  # WARC/ARC/WET records by type, damage

    def __post_init__(self) -> None:
        if isinstance(self.crawl, dict):  # from to_dict(): a Ray task's or a report's counts
            self.crawl = WarcStats.from_dict(self.crawl)

    def note(self, kind: str, where: str) -> None:
        """Count one problem of `kind` (a field name above) and keep its position if among the first."""
        setattr(self, kind, getattr(self, kind) + 1)
        examples = getattr(self, f"{kind.removesuffix('_files')}_examples")
        if len(examples) < MAX_PROBLEMS:
            examples.append(where)

    def merge(self, other: "ReadStats") -> None:
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, WarcStats):
                mine.merge(theirs)
            elif isinstance(mine, list):
                mine.extend(theirs[: MAX_PROBLEMS - len(mine)])
            else:
                setattr(self, f.name, mine + theirs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def examples(self, limit: int = 5) -> list[str]:
        """The first positions of every kind of problem, for a terminal summary."""
        out = []
        for kind in PROBLEM_KINDS:
            out += getattr(self, f"{kind.removesuffix('_files')}_examples")
        return (out + self.crawl.examples(limit))[:limit]


    def summary(self) -> str:
        parts = [f"{self.records:,} records from {self.files:,} files ({self.bytes / 1e6:.1f} MB)"]
        for kind in PROBLEM_KINDS:
            if getattr(self, kind):
                parts.append(f"{getattr(self, kind):,} {kind.replace('_', ' ')}")
        if self.crawl.files:
            parts.append(self.crawl.summary())
        return ", ".join(parts)
