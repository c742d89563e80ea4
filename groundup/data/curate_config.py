"""`CurateConfig`: every knob of `groundup data curate`, with the published thresholds as defaults.

Sections follow the filter families. Which filters judge which domain is the `[filters]` table:
prose filters judge text, code filters judge code, and math has its own, because a prose filter
applied to code removes all of it (see docs/architecture.md). A domain with no entry passes unfiltered.

    [filters]
    text = ["gopher_quality", "gopher_repetition", "ngram_repetition"]   # add "c4", "fineweb"
    code = ["code"]
    math = ["math"]

    [mixing]
    weights = { code = 0.55, text = 0.25, math = 0.20 }
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from groundup.benchmarks import resolve_tasks
from groundup.config import fail
from groundup.data.web.extract import ExtractConfig
from groundup.data.web.language import LanguageConfig
from groundup.data.web.perplexity import PerplexityConfig
from groundup.data.web.url_lists import URLFilterConfig
from groundup.data.substring_dedup import SubstringDedupConfig

FILTER_NAMES = ("gopher_quality", "gopher_repetition", "c4", "fineweb", "ngram_repetition", "code", "math")


def _default_filters() -> dict[str, list[str]]:
    return {
        "text": ["gopher_quality", "gopher_repetition", "ngram_repetition"],
        "code": ["code"],
        "math": ["math"],
    }


@dataclass
class ReadConfig:
    max_record_bytes: int = 64 << 20  # longer JSONL lines are skipped and counted; longer files split
    default_domain: str | None = None  # domain for records and text files that name none ("text")
    # Input files are read in tasks of at least this many bytes on disk (data/input_tasks.py): a larger
    # file is a task of its own, smaller ones are grouped with the next. Shards never span two tasks,
    # so this decides the output shards; `--executor ray` runs each task as one Ray task.
    task_bytes: int = 4 << 20
    # a crawl page (WARC/ARC) whose HTTP payload is larger is skipped and counted, never held whole
    max_page_bytes: int = 8 << 20

    def validate(self) -> None:
        if self.task_bytes < 1:
            fail("task_bytes", self.task_bytes, "at least 1")


@dataclass
class NormalizeConfig:
    nfc: bool = True  # compose accents so that "é" is one code point whichever way it was typed
    control_chars: bool = True  # drop C0/C1 controls except tab and newline (indentation survives)
    line_endings: bool = True  # CRLF and CR become LF


@dataclass
class GopherQualityConfig:
    """Rae et al. 2021 (Gopher), Table A1; the same rules and tokenisation as datatrove."""

    min_doc_words: int = 50  # fewest words (punctuation-only words not counted); 0 = off
    max_doc_words: int = 100_000  # most words, counted the same way; 0 = off
    min_avg_word_length: float = 3.0  # lowest mean word length in characters; 0 = off
    max_avg_word_length: float = 10.0  # highest mean word length in characters; 0 = off
    max_symbol_word_ratio: float = 0.1  # "#" and "..." each, per word
    max_bullet_lines_ratio: float = 0.9  # max share of lines that start with a bullet ("•" or "-"); 0 = off
    max_ellipsis_lines_ratio: float = 0.3  # max share of lines that end in "..." or "…"; 0 = off
    min_alpha_words_ratio: float = 0.8  # words with at least one letter
    min_stop_words: int = 2  # fewest different words of stop_words a document must contain; 0 = off
    # the words min_stop_words counts (matched as whole words, case-sensitive)
    stop_words: list[str] = field(default_factory=lambda: ["the", "be", "to", "of", "and", "that", "have", "with"])


@dataclass
class GopherRepetitionConfig:
    dup_line_frac: float = 0.30  # max share of lines that repeat an earlier line; 0 = off
    dup_para_frac: float = 0.30  # max share of paragraphs (blank-line separated) repeating an earlier one; 0 = off
    dup_line_char_frac: float = 0.20  # max share of the characters in repeated lines; 0 = off
    dup_para_char_frac: float = 0.20  # max share of the characters in repeated paragraphs; 0 = off
    top_ngram_sizes: list[int] = field(default_factory=lambda: [2, 3, 4])  # word n-gram sizes of the top-n-gram rule
    # per size: max share of the characters the most frequent n-gram covers (all its occurrences)
    top_ngram_fracs: list[float] = field(default_factory=lambda: [0.20, 0.18, 0.16])
    # word n-gram sizes of the duplicated-n-gram rule
    dup_ngram_sizes: list[int] = field(default_factory=lambda: [5, 6, 7, 8, 9, 10])
    # per size: max share of the characters in n-grams that repeat an earlier one (overlaps counted once)
    dup_ngram_fracs: list[float] = field(default_factory=lambda: [0.15, 0.14, 0.13, 0.12, 0.11, 0.10])

    def validate(self) -> None:
        if len(self.top_ngram_sizes) != len(self.top_ngram_fracs):
            fail("top_ngram_fracs", self.top_ngram_fracs, f"{len(self.top_ngram_sizes)} values, one per size")
        if len(self.dup_ngram_sizes) != len(self.dup_ngram_fracs):
            fail("dup_ngram_fracs", self.dup_ngram_fracs, f"{len(self.dup_ngram_sizes)} values, one per size")


@dataclass
class C4Config:
    """Raffel et al. 2020 (C4): keeps only lines that look like sentences; can drop the page."""

    min_words_per_line: int = 3  # drop lines with fewer words
    min_sentences: int = 5  # drop the page when its kept lines hold fewer sentences
    max_word_length: int = 1000  # drop lines with a longer word (characters); -1 = off
    terminal_punctuation: bool = True  # keep only lines ending in . ? ! " or ' (not "...")
    remove_citations: bool = True  # strip [1], [edit] and [citation needed] markers from lines
    lorem_ipsum: bool = True  # drop the page if a line otherwise kept contains "lorem ipsum"
    javascript: bool = True  # drop lines that mention "javascript"
    curly_bracket: bool = True  # drop the page if a line otherwise kept contains "{"
    policy: bool = True  # drop lines about terms of use, privacy or cookie policies


@dataclass
class FineWebConfig:
    """Penedo et al. 2024 (FineWeb) quality rules, as datatrove's FineWebQualityFilter."""

    line_punct_thr: float = 0.12  # at least this fraction of lines end in terminal punctuation
    line_punct_exclude_zero: bool = False  # let a document with no line ending in punctuation pass line_punct_thr
    short_line_thr: float = 0.67  # at most this fraction of lines are short
    short_line_length: int = 30  # a line of at most this many characters is short
    char_duplicates_ratio: float = 0.01  # characters in duplicated lines / all characters
    new_line_ratio: float = 0.3  # newlines per word


@dataclass
class NgramRepetitionConfig:
    n: int = 5  # word n-gram length (punctuation-only words left out)
    max_repeated_fraction: float = 0.15  # word n-grams that already occurred earlier in the document


@dataclass
class CodeFilterConfig:
    """The Stack / StarCoder style rules; `drop_*` act on what the reader recognised by path."""

    max_line_length: int = 1000  # drop files with a longer line (characters)
    max_mean_line_length: float = 100.0  # drop files whose mean line length (characters) is above this
    min_alnum_fraction: float = 0.25  # drop files with a smaller share of letters and digits
    min_byte_entropy: float = 2.5  # bits per byte: below is a repeated pattern or padding
    max_byte_entropy: float = 6.0  # above is base64, compressed or random data, not code
    min_chars: int = 20  # drop shorter files (characters)
    drop_vendored: bool = True  # drop files under vendor/, third_party/, node_modules/ and the like
    drop_generated: bool = True  # drop generated files: by path (e.g. _pb2.py) or by generated_markers
    drop_minified: bool = True  # drop minified files (by path: .min.js, .bundle.js, ...)
    # phrases that mark a generated file (with drop_generated), matched in any case
    generated_markers: list[str] = field(default_factory=lambda: [
        "auto-generated", "autogenerated", "automatically generated", "generated by", "do not edit",
        "code generated"])
    marker_lines: int = 5  # generated-file markers are looked for in the first lines only


@dataclass
class MathFilterConfig:
    min_chars: int = 20  # drop shorter documents (characters)
    max_chars: int = 200_000  # drop longer documents (characters)
    min_digit_fraction: float = 0.01  # a math document has numbers in it
    max_symbol_fraction: float = 0.5  # characters neither letter, digit nor space
    max_line_length: int = 2000  # drop documents with a longer line (characters)
    require_pattern: str = ""  # a regex each document must match, e.g. "Answer:"


@dataclass
class PIIConfig:
    enabled: bool = True  # replace personal data in the documents of `domains` with placeholders
    email: bool = True  # redact e-mail addresses
    ip: bool = True  # redact IPv4 and IPv6 addresses
    phone: bool = True  # redact phone numbers (North American forms, or + and a country code)
    public_ips_only: bool = True  # 127.0.0.1 or 192.168.0.1 identify nobody (as datatrove)
    domains: list[str] = field(default_factory=lambda: ["text", "code", "math"])  # domains that are redacted
    email_placeholder: str = "<EMAIL>"  # what replaces an e-mail address
    ip_placeholder: str = "<IP_ADDRESS>"  # what replaces an IP address
    phone_placeholder: str = "<PHONE>"  # what replaces a phone number


@dataclass
class ClassifierConfig:
    model: str | None = None  # a file written by `groundup data train-classifier`; none: off
    domains: list[str] = field(default_factory=lambda: ["text"])  # domains the classifier scores and filters
    threshold: float = 0.5  # keep documents whose score is at least this
    top_fraction: float | None = None  # or keep this fraction of best-scored documents per domain

    def validate(self) -> None:
        if self.top_fraction is not None and not 0 < self.top_fraction <= 1:
            fail("top_fraction", self.top_fraction, "a number in (0, 1]")


@dataclass
class ExactDedupConfig:
    enabled: bool = True  # drop documents whose text (outer whitespace stripped) repeats an earlier one's


@dataclass
class MinHashConfig:
    enabled: bool = True  # drop near-duplicates of earlier documents (MinHash LSH) in `domains`
    ngram: int = 5  # word n-gram shingles
    bands: int = 14  # LSH bands of `rows` hashes each; documents equal in any whole band are near-duplicates
    rows: int = 8  # 14 x 8 as datatrove: pairs at Jaccard 0.8 collide with probability 0.92+
    seed: int = 1  # of the hash permutations
    memory_mb: int = 256  # band keys are bucketed so that one pass holds at most about this much
    # Templated math problems that differ only in their numbers share most word 5-grams, yet each
    # is a different exercise: near-duplicate removal would delete most of a generated math set.
    domains: list[str] = field(default_factory=lambda: ["text", "code"])  # domains near-duplicates are removed from

    def validate(self) -> None:
        for key in ("ngram", "bands", "rows", "memory_mb"):
            if getattr(self, key) < 1:
                fail(key, getattr(self, key), "at least 1")


@dataclass
class SimHashConfig:
    """Charikar's SimHash, 64-bit, over the same word n-grams as MinHash (data/simhash.py): a faster
    alternative, used when `dedup.near = "simhash"`."""

    enabled: bool = True  # drop near-duplicates of earlier documents (SimHash) in `domains`; false: off
    ngram: int = 5  # word n-gram shingles
    # fingerprints at most this many bits apart are near-duplicates; 0: equal only. Manku et al. (2007) used 3 for
    # whole pages; on 3,000-character chunks 3 finds 39% of the pairs MinHash finds, 10 finds 90% at 0.94 precision
    # (benchmarks/simhash_recall.py); candidate checks grow as N^2 / 2^(64 / (k + 1)), so a huge corpus may want 8
    k: int = 10
    # A larger k finds more (benchmarks/simhash_recall.py) but checks more candidates: each of the k + 1
    # blocks is 64 / (k + 1) bits, and about N^2 / 2^(64 / (k + 1)) pairs of N documents share one.
    seed: int = 1  # of the shingle-hash mix: another seed gives other fingerprints
    memory_mb: int = 256  # fingerprints are bucketed so that one pass holds at most about this much
    # math stays out for the same reason as with MinHash (templated problems differ only in numbers)
    domains: list[str] = field(default_factory=lambda: ["text", "code"])  # domains near-duplicates are removed from

    def validate(self) -> None:
        for key in ("ngram", "memory_mb"):
            if getattr(self, key) < 1:
                fail(key, getattr(self, key), "at least 1")
        if not 0 <= self.k <= 15:  # k + 1 blocks of at least 4 bits; narrower ones make everything a candidate
            fail("k", self.k, "an integer from 0 to 15")


@dataclass
class DedupConfig:
    exact: ExactDedupConfig = field(default_factory=ExactDedupConfig)
    near: Literal["minhash", "simhash"] = "minhash"  # the near-duplicate method: `minhash` or `simhash` below
    minhash: MinHashConfig = field(default_factory=MinHashConfig)
    simhash: SimHashConfig = field(default_factory=SimHashConfig)
    substring: SubstringDedupConfig = field(default_factory=SubstringDedupConfig)  # exact repeated spans (off by default)
    cluster_examples: int = 5  # clusters shown in the report, largest first

    def near_config(self) -> MinHashConfig | SimHashConfig:
        """The settings of the near-duplicate method that runs (`enabled`, `domains`, `memory_mb`)."""
        return self.simhash if self.near == "simhash" else self.minhash


@dataclass
class DecontaminateConfig:
    """Drop training documents that share a word 13-gram with a benchmark item (data/decontaminate.py)."""

    tasks: list[str] = field(default_factory=list)  # eval task names, groups or .toml files; empty: off
    ngram: int = 13  # lm-eval's decontamination n-gram
    limit: int | None = None  # only the first items of each task

    def validate(self) -> None:
        if self.ngram < 1:
            fail("ngram", self.ngram, "at least 1")
        if self.tasks:  # an unknown task fails now, not after the shards are curated

            resolve_tasks(",".join(self.tasks))


@dataclass
class MixingConfig:
    weights: dict[str, float] = field(default_factory=dict)  # domain -> share of output bytes; empty: no mixing
    max_repeats: int = 4  # no document is written more often than this
    total_bytes: int | None = None  # none: the deduplicated size, or less if repeats cap it

    def validate(self) -> None:
        if any(w < 0 for w in self.weights.values()):
            fail("weights", self.weights, "non-negative weights")
        if self.weights and sum(self.weights.values()) <= 0:
            fail("weights", self.weights, "at least one positive weight")
        if self.max_repeats < 1:
            fail("max_repeats", self.max_repeats, "at least 1")


@dataclass
class OutputConfig:
    format: Literal["parquet", "jsonl"] = "parquet"  # file format of the output shards
    shard_docs: int = 20_000  # a shard closes at this many documents ...
    shard_bytes: int = 64 << 20  # ... or this many bytes of text, whichever comes first
    compression: Literal["zstd", "snappy", "gzip", "none"] = "zstd"  # Parquet codec; JSONL is never compressed
    shuffle: bool = True  # shuffle rows within each output shard (seeded), so repeats are spread
    examples: int = 5  # removed documents shown per filter in the report
    snippet_chars: int = 300  # characters of each removed document shown in the report
    # Per shard and domain, this many documents also go through every filter NOT configured for
    # their domain, without effect, so the report shows what a filter would do if applied blindly.
    audit_docs: int = 20

    def validate(self) -> None:
        if self.shard_docs < 1 or self.shard_bytes < 1:
            fail("shard_docs", self.shard_docs, "shard_docs and shard_bytes of at least 1")


@dataclass
class CurateConfig:
    seed: int = 0  # of the order mixing picks extra copies in, and of the output shuffle
    workers: int = 1  # processes that curate shards in parallel on this machine (--workers)
    filters: dict[str, list[str]] = field(default_factory=_default_filters)  # domain -> the filters that judge it
    read: ReadConfig = field(default_factory=ReadConfig)
    extract: ExtractConfig = field(default_factory=ExtractConfig)  # HTML to text, for crawl (WARC/ARC) inputs
    language: LanguageConfig = field(default_factory=LanguageConfig)  # fastText lid.176: tag, or keep by language
    normalize: NormalizeConfig = field(default_factory=NormalizeConfig)
    gopher_quality: GopherQualityConfig = field(default_factory=GopherQualityConfig)
    gopher_repetition: GopherRepetitionConfig = field(default_factory=GopherRepetitionConfig)
    c4: C4Config = field(default_factory=C4Config)
    fineweb: FineWebConfig = field(default_factory=FineWebConfig)
    ngram_repetition: NgramRepetitionConfig = field(default_factory=NgramRepetitionConfig)
    code: CodeFilterConfig = field(default_factory=CodeFilterConfig)
    math: MathFilterConfig = field(default_factory=MathFilterConfig)
    perplexity: PerplexityConfig = field(default_factory=PerplexityConfig)  # CCNet-style head/middle/tail
    pii: PIIConfig = field(default_factory=PIIConfig)
    url: URLFilterConfig = field(default_factory=URLFilterConfig)
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    decontaminate: DecontaminateConfig = field(default_factory=DecontaminateConfig)
    mixing: MixingConfig = field(default_factory=MixingConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    @classmethod
    def preprocess(cls, data: dict, prefix: str = "") -> dict:
        # `filters.text=[...]` replaces one domain's list and keeps the others' defaults.
        if isinstance(data.get("filters"), dict):
            data["filters"] = {**_default_filters(), **data["filters"]}
        return data

    def validate(self) -> None:
        if self.workers < 1:
            fail("workers", self.workers, "at least 1")
        for domain, names in self.filters.items():
            for name in names:
                if name not in FILTER_NAMES:
                    fail(f"filters.{domain}", names, "filter names from " + ", ".join(FILTER_NAMES))


def fingerprint_dict(cfg: CurateConfig) -> dict:
    """The settings that decide which shards a run writes: a restart with other values would mix
    two runs, so the pipeline compares these. Workers only change speed."""
    data = dataclasses.asdict(cfg)
    data.pop("workers")
    return data
