"""Read raw inputs as text records: the one entry point every data stage uses.

    stats = ReadStats()
    for record in iter_records(["corpus/", "extra.jsonl.zst"], stats):
        record["id"], record["source"], record["domain"], record["text"]   # always present
        record.get("url")                                                    # when the input has one

Inputs and what they become:
- `.txt`, `.md`, `.rst` (also `.gz`, `.zst`): one record per file, domain "text" (or
  `default_domain`). A file larger than `max_record_bytes` is split at line breaks into parts
  `path#NNNN`, so a huge file never has to fit in memory at once.
- `.jsonl` (also `.gz`, `.zst`): one record per line; every field is kept. Lines without a string
  `text`, lines that are not JSON objects (or nest deeper than Python can parse, or hold integers too
  long to convert), records whose `id`, `source`, `domain`, `url` or `language` is not a string, and
  lines longer than `max_record_bytes` are skipped and counted with their `file:line`. Escaped lone
  surrogates (which no UTF-8 text can hold) become U+FFFD and are counted as invalid UTF-8.
- `.parquet`: one record per row, read a row group at a time; every column is kept.
- `.warc`, `.arc`, `.wet` (also `.gz`, one member per record as Common Crawl writes them; needs
  groundup[web]): one record per HTML page (data/web/records.py): `id` the WARC record id, `url`,
  `warc` (record id, date, file, offset), and the page's main content as `text` with its `title`,
  `language` and `language_score`; a page without main content is counted as `no_text`. With
  `raw_html=True` (what `data curate` asks for) the HTML itself is the `text`, with `format` "html",
  and the curator extracts it in its workers. Damaged records are counted in `ReadStats.crawl`.
- directories: walked recursively in sorted order; source files become domain "code" with a
  `language` field, and path conventions mark `vendored`, `generated` and `minified` files (the
  code filters drop them by default, so the report shows how many there were).

Problems never stop the read: they are counted in `ReadStats` with the first few positions.
Only input that yields no record at all raises `DataError`.

`iter_records` is `iter_input_files` (every file, in reading order) and `read_input_file` (one
file's records) put together; the data stages that cut their work per file (`data/input_tasks.py`) call
the two themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import IO, Iterator, Sequence

import zstandard

from groundup.data.web.records import RecordExtractor, iter_crawl_records
from groundup.data.web.extract import ExtractConfig
from groundup.data.read_stats import MAX_PROBLEMS, PROBLEM_KINDS, ReadStats

__all__ = ["PROBLEM_KINDS", "ReadStats", "InputFile", "check_inputs", "iter_input_files", "iter_records",
           "no_records_error", "read_input_file"]
from groundup.data.web.warc import is_crawl_file
from groundup.errors import DataError
from groundup.io import open_compressed
from groundup.layout import OUTPUT_MARKER_FILE

TEXT_EXTENSIONS = {".txt": "text", ".md": "markdown", ".rst": "rst"}
JSONL_EXTENSIONS = {".jsonl", ".ndjson"}
CODE_EXTENSIONS = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".tsx": "typescript", ".java": "java", ".kt": "kotlin", ".scala": "scala",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp",
    ".cs": "csharp", ".go": "go", ".rs": "rust", ".rb": "ruby", ".php": "php", ".swift": "swift",
    ".m": "objective-c", ".lua": "lua", ".pl": "perl", ".r": "r", ".jl": "julia", ".hs": "haskell",
    ".ml": "ocaml", ".ex": "elixir", ".erl": "erlang", ".clj": "clojure", ".dart": "dart",
    ".sh": "shell", ".bash": "shell", ".zsh": "shell", ".ps1": "powershell", ".sql": "sql",
    ".html": "html", ".css": "css", ".scss": "css", ".vue": "vue", ".tex": "tex",
    ".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".cmake": "cmake", ".f90": "fortran",
}
COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")
# Walked past without a word: version-control and tool caches are never corpus material.
# What groundup itself leaves in a folder it wrote (which verb made it, the writer's lock): not data.
SKIP_FILES = {OUTPUT_MARKER_FILE, ".lock"}
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".tox", ".ruff_cache"}
# Read, but marked: third-party code copied into a repository is someone else's (and duplicated
# across many repositories), so the code filters drop it by default and the report counts it.
VENDORED_DIRS = {"vendor", "vendored", "third_party", "thirdparty", "third-party", "node_modules",
                 "bower_components", "site-packages", "dist-packages", ".venv", "venv", "external"}
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", ".pb.go", ".pb.cc", ".pb.h", "_generated.go", ".g.dart",
                      ".designer.cs", "-lock.json", ".lock")
MINIFIED_MARKERS = (".min.js", ".min.css", "-min.js", ".bundle.js")
SNIFF_BYTES = 8192
STRING_FIELDS = ("id", "source", "domain", "url", "language")  # fields the stages read as text, when present


def _base_suffix(path: Path) -> str:
    """The extension that says what a file holds, under any compression: `a.jsonl.zst` -> `.jsonl`."""
    name = path.name.lower()
    for suffix in COMPRESSED_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return os.path.splitext(name)[1]


def _decode(data: bytes, where: str, stats: ReadStats) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        stats.note("invalid_utf8", f"{where}: invalid UTF-8 at byte {e.start}, replaced")
        return data.decode("utf-8", errors="replace")


def _is_binary(head: bytes) -> bool:
    # A NUL byte never occurs in UTF-8 text; git and grep use the same test.
    return b"\x00" in head


def _read_lines(f: IO[bytes], max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """Yield (line number, line) with None for a line over `max_bytes`, which is skipped in
    1 MiB steps so that one giant line costs no more memory than the limit."""
    lineno = 0
    while True:
        line = f.readline(max_bytes + 1)
        if not line:
            return
        lineno += 1
        if len(line) > max_bytes and not line.endswith(b"\n"):
            while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass
            yield lineno, None
        else:
            yield lineno, line


def _without_surrogates(value: str) -> str:
    """Each lone surrogate (an escape like \\ud800 in JSON) becomes one U+FFFD."""
    return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _check_fields(record: dict, where: str, stats: ReadStats) -> bool:
    """False (and counted) when a field the stages read as text is not one; lone surrogates are replaced."""
    for key in STRING_FIELDS:
        value = record.get(key)
        if value is not None and not isinstance(value, str):
            stats.note("bad_field", f"{where}: field {key!r} must be a string, got {type(value).__name__}")
            return False
    for key, value in record.items():
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                record[key] = _without_surrogates(value)
                stats.note("invalid_utf8", f"{where}: lone surrogate in {key!r}, replaced")
    return True


def _finish(record: dict, source: str, domain: str, rid: str) -> dict:
    """Fill in the fields every record carries, keeping whatever else the input had."""
    record["id"] = str(record["id"]) if record.get("id") not in (None, "") else rid
    record["source"] = str(record["source"]) if record.get("source") else source
    record["domain"] = str(record["domain"]) if record.get("domain") else domain
    if "url" in record and not record["url"]:
        del record["url"]  # an empty url is no url: the URL filters only judge real ones
    return record


def _iter_jsonl(path: Path, source: str, domain: str, stats: ReadStats, max_bytes: int,
                require_text: bool = True) -> Iterator[dict]:
    with open_compressed(path) as f:
        for lineno, line in _read_lines(f, max_bytes):
            where = f"{path}:{lineno}"
            if line is None:
                stats.note("too_long", f"{where}: line longer than {max_bytes:,} bytes, skipped")
                continue
            if not line.strip():
                continue
            text = _decode(line, where, stats)
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                stats.note("bad_json", f"{where}: invalid JSON: {e.msg} (column {e.colno})")
                continue
            except (ValueError, RecursionError) as e:  # an integer too long to convert, nesting too deep
                reason = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]
                stats.note("bad_json", f"{where}: unreadable JSON: {reason}")
                continue
            if not isinstance(record, dict):
                stats.note("bad_json", f"{where}: expected a JSON object, got {type(record).__name__}")
                continue
            if require_text and not isinstance(record.get("text"), str):
                stats.note("no_text", f"{where}: no string 'text' field")
                continue
            if not _check_fields(record, where, stats):
                continue
            stats.bytes += len(line)
            if not require_text:
                record["_where"] = where  # structured records (chats, pairs) name their position in errors
            yield _finish(record, source, domain, f"{source}:{lineno}")


def _iter_parquet(path: Path, source: str, domain: str, stats: ReadStats, require_text: bool = True) -> Iterator[dict]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
        stats.note("unreadable_files", f"{path}: not a readable Parquet file ({e}), skipped")
        return
    if require_text and "text" not in pf.schema_arrow.names:
        stats.no_text += pf.metadata.num_rows
        if len(stats.no_text_examples) < MAX_PROBLEMS:
            stats.no_text_examples.append(f"{path}: no 'text' column ({pf.metadata.num_rows:,} rows skipped)")
        return
    row = 0
    for batch in pf.iter_batches(batch_size=1024):
        for record in batch.to_pylist():
            row += 1
            if require_text and not isinstance(record.get("text"), str):
                stats.note("no_text", f"{path}:row {row}: 'text' is empty or not a string")
                continue
            if not _check_fields(record, f"{path}:row {row}", stats):
                continue
            if require_text:
                stats.bytes += len(record["text"].encode("utf-8"))
            else:
                record["_where"] = f"{path}:row {row}"
            yield _finish(record, source, domain, f"{source}:{row}")


def _iter_text_file(path: Path, rid: str, source: str, domain: str, stats: ReadStats,
                    max_bytes: int, extra: dict) -> Iterator[dict]:
    """One record per file; a file over `max_bytes` becomes parts cut at line breaks."""
    with open_compressed(path) as f:
        head = f.read(max_bytes + 1)
        if _is_binary(head[:SNIFF_BYTES]):
            stats.note("binary_files", f"{path}: binary (NUL bytes), skipped")
            return
        if len(head) <= max_bytes:
            stats.bytes += len(head)
            yield {"id": rid, "source": source, "domain": domain, "text": _decode(head, str(path), stats), **extra}
            return
        part, pending = 0, head
        while pending:
            cut = pending.rfind(b"\n", 0, max_bytes) + 1 or max_bytes  # no newline at all: hard cut
            if len(pending) <= max_bytes:
                cut = len(pending)
            chunk, pending = pending[:cut], pending[cut:]
            stats.bytes += len(chunk)
            yield {"id": f"{rid}#{part:04d}", "source": source, "domain": domain,
                   "text": _decode(chunk, f"{path}#{part:04d}", stats), **extra}
            part += 1
            pending += f.read(max_bytes + 1 - len(pending))


def _code_flags(rel: str) -> dict:
    parts = rel.lower().split("/")
    name = parts[-1]
    flags = {}
    if any(p in VENDORED_DIRS for p in parts[:-1]):
        flags["vendored"] = True
    if name.endswith(GENERATED_SUFFIXES) or ".generated." in name:
        flags["generated"] = True
    if any(m in name for m in MINIFIED_MARKERS):
        flags["minified"] = True
    return flags


@functools.cache
def _default_extractor() -> RecordExtractor:
    """One per process: the HTML and language models load once."""
    return RecordExtractor(ExtractConfig())



def _iter_crawl(path: Path, domain: str, stats: ReadStats, raw_html: bool, max_page_bytes: int) -> Iterator[dict]:
    """A crawl file's pages as records: extracted text, or (raw_html) the HTML for the caller to extract."""
    pages_before = stats.crawl.page_bytes
    for record in iter_crawl_records(path, _source_name(path), domain, stats.crawl, max_page_bytes):
        stats.bytes += stats.crawl.page_bytes - pages_before  # the payloads read (decoded HTML or WET text)
        pages_before = stats.crawl.page_bytes
        if raw_html:
            yield record
            continue
        extracted = _default_extractor()(record)
        if extracted is None:
            warc = record["warc"]
            stats.note("no_text", f"{warc['file']}@{warc['offset']}: no main content in the HTML of {record['url']}")
        else:
            yield extracted


def _iter_file(path: Path, rel: str, source: str, default_domain: str | None, stats: ReadStats,
               max_bytes: int, in_directory: bool, require_text: bool = True, raw_html: bool = False,
               max_page_bytes: int = 8 << 20) -> Iterator[dict]:
    suffix = _base_suffix(path)
    rid = f"{source}/{rel}" if in_directory else source
    stats.files += 1
    if require_text and is_crawl_file(path):
        yield from _iter_crawl(path, default_domain or "text", stats, raw_html, max_page_bytes)
    elif suffix in JSONL_EXTENSIONS:  # records name their own source; else the file's name does
        yield from _iter_jsonl(path, _source_name(path), default_domain or "text", stats, max_bytes, require_text)
    elif suffix == ".parquet":
        yield from _iter_parquet(path, _source_name(path), default_domain or "text", stats, require_text)
    elif not require_text:  # structured records come only from JSONL and Parquet
        stats.note("unsupported_files", f"{path}: structured records are read from .jsonl or .parquet only")
    elif suffix in CODE_EXTENSIONS:
        extra = {"language": CODE_EXTENSIONS[suffix], **_code_flags(rel)}
        yield from _iter_text_file(path, rid, source, "code", stats, max_bytes, extra)
    elif suffix in TEXT_EXTENSIONS or not in_directory:
        # A file named on the command line is read as text whatever its name; inside a directory
        # only known extensions are, so images, archives and build outputs are not mistaken for text.
        yield from _iter_text_file(path, rid, source, default_domain or "text", stats, max_bytes, {})
    else:
        stats.files -= 1
        with open(path, "rb") as f:
            binary = _is_binary(f.read(SNIFF_BYTES))
        if binary:
            stats.note("binary_files", f"{path}: binary (NUL bytes), skipped")
        else:
            stats.note("unsupported_files", f"{path}: extension {suffix or '(none)'!r} not read")


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if name not in SKIP_FILES:
                yield Path(dirpath) / name


def _source_name(path: Path) -> str:
    name = path.resolve().name
    for suffix in COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    return name if path.is_dir() else os.path.splitext(name)[0] or name


@dataclasses.dataclass(frozen=True)
class InputFile:
    """One file to read, with what its records are named after: `source` is the input path's name
    (a directory's or a file's) and `rel` the file's path inside that directory."""

    path: Path
    rel: str
    source: str
    in_directory: bool


def iter_input_files(paths: Sequence[str | Path]) -> Iterator[InputFile]:
    """Every file the inputs name, in reading order: the paths as given, directories walked sorted."""
    for p in map(Path, paths):
        source = _source_name(p)
        if p.is_dir():
            for f in _walk(p):
                yield InputFile(f, f.relative_to(p).as_posix(), source, True)
        else:
            yield InputFile(p, p.name, source, False)


def check_inputs(paths: Sequence[str | Path]) -> None:
    """DataError for no input at all or a path that does not exist, before any work starts."""
    if not paths:
        raise DataError("no input given: name at least one file or directory")
    for p in paths:
        if not Path(p).exists():
            raise DataError(f"input not found: {p}")


def read_input_file(file: InputFile, stats: ReadStats, default_domain: str | None = None,
                    max_record_bytes: int = 64 << 20, require_text: bool = True, raw_html: bool = False,
                    max_page_bytes: int = 8 << 20) -> Iterator[dict]:
    """The records of one input file; a file that cannot be read to the end is counted and skipped.
    `raw_html`: crawl pages keep their HTML as `text` (format "html") for the caller to extract."""
    try:
        for record in _iter_file(file.path, file.rel, file.source, default_domain, stats, max_record_bytes,
                                 file.in_directory, require_text, raw_html, max_page_bytes):
            stats.records += 1
            yield record
    except (OSError, EOFError, ValueError, zstandard.ZstdError) as e:  # truncated, corrupt (pyarrow's
        # errors are ValueErrors), unreadable: name it and go on with the next file
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        stats.note("unreadable_files", f"{file.path}: unreadable ({reason}), skipped")


def no_records_error(paths: Sequence[str | Path], stats: ReadStats) -> DataError:
    """What reading inputs that hold no record at all ends with (several readers share the words)."""
    return DataError(f"no records found in {', '.join(map(str, paths))}: {stats.summary()}"
                     + "".join(f"; {e}" for e in (stats.bad_json_examples + stats.no_text_examples)[:3]))


def iter_records(paths: Sequence[str | Path], stats: ReadStats | None = None, default_domain: str | None = None,
                 max_record_bytes: int = 64 << 20, require_text: bool = True) -> Iterator[dict]:
    """Yield text records from files and directories (see the module docstring for the formats).

    `require_text=False` reads structured records (chats, preference pairs) from JSONL and Parquet:
    every JSON object is yielded, with `_where` = its "file:line" for the caller's messages.

    Raises DataError for a path that does not exist or, after reading everything, when no record
    was found; every other problem is counted in `stats` and skipped.
    """
    stats = stats if stats is not None else ReadStats()
    if isinstance(paths, (str, Path)):
        paths = [paths]
    check_inputs(paths)
    start = stats.records
    for file in iter_input_files(paths):
        yield from read_input_file(file, stats, default_domain, max_record_bytes, require_text)
    if stats.records == start:
        raise no_records_error(paths, stats)
