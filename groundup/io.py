"""File helpers every stage uses: atomic writes, compressed text, checksums.

A crash must never leave a half-written file that looks complete, so outputs are written under
a temporary name in the same directory and renamed into place (rename is atomic on POSIX).

A full disk (ENOSPC, or EDQUOT for a spent quota) met by any of these writers is a DiskFullError naming the
file (its final path, not the temporary one), whichever library did the writing: the file's own `write`
raises it (`open_named`), and a writer that swallows it (torch's zip writer reports a position mismatch,
numpy's `tofile` a short write, safetensors' Rust writer its own error) is recognised on the way out.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator

from groundup.errors import DataError, DiskFullError


def _read_umask() -> int:
    mask = os.umask(0)  # the only portable way to read it; set straight back
    os.umask(mask)
    return mask


# Read once, at import (one thread): reading it means setting it for a moment, which a file created
# meanwhile by another thread (an asynchronous checkpoint writer) would feel.
UMASK = _read_umask()


def follow_umask(path: str | Path) -> Path:
    """Give a file or directory the permissions the user's umask gives a new one: mkdtemp (0700) and
    safetensors' save_file (0600) create them private, so another user or a container could not read a
    model, an adapter or a checkpoint written through them."""
    path = Path(path)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~UMASK)
    return path


FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
# What writers without an errno say: safetensors' "No space left on device (os error 28)"; numpy's short write
# ("N requested and M written", an OSError), which a regular file gives only when its disk is full.
_FULL_DISK_WORDS = re.compile("|".join([*(re.escape(os.strerror(code)) for code in FULL_DISK),
                                        r"os error (%d|%d)\b" % FULL_DISK]))
_SHORT_WRITE = re.compile(r"^\d+ requested and \d+ written$")


def full_disk_reason(e: BaseException) -> str | None:
    """Why `e` means a full disk, in the system's words, or None: an OSError with ENOSPC or EDQUOT anywhere in
    its chain of causes, or an error from a writer that carries no errno but says so."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FULL_DISK:
            return e.reason if isinstance(e, DiskFullError) else e.strerror or os.strerror(e.errno)
        if _FULL_DISK_WORDS.search(str(e)) or (isinstance(e, OSError) and _SHORT_WRITE.match(str(e))):
            return os.strerror(errno.ENOSPC)
        e = e.__cause__ or e.__context__
    return None


def disk_full_error(e: BaseException, path: str | Path) -> DiskFullError | None:
    """`e` as a DiskFullError naming `path` (one naming its file already stays as it is), or None."""
    if isinstance(e, DiskFullError):
        return e
    reason = full_disk_reason(e)
    if reason is None:
        return None
    code = errno.EDQUOT if reason == os.strerror(errno.EDQUOT) else errno.ENOSPC
    return DiskFullError(path, reason, code)


@contextlib.contextmanager
def naming_full_disk(path: str | Path) -> Iterator[None]:
    """A full disk met in the block is a DiskFullError naming `path`."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - only a full disk is changed
        named = disk_full_error(e, path)
        if named is None or named is e:
            raise
        raise named from e


class _NamedFile(io.FileIO):
    """The file under a writer's buffer: its write raises a full disk as DiskFullError naming `shown`, so the
    error names the right file whichever library writes, and keeps it in `full` for one that swallows it."""

    def __init__(self, file: str | Path, mode: str, shown: str | Path):
        super().__init__(file, mode)
        self.shown, self.full = shown, None

    def write(self, data) -> int:
        try:
            return super().write(data)
        except OSError as e:
            if e.errno not in FULL_DISK:
                raise
            self.full = DiskFullError(self.shown, e.strerror or os.strerror(e.errno), e.errno)
            raise self.full from None


def open_named(path: str | Path, mode: str = "w", shown: str | Path | None = None, encoding: str | None = None,
               errors: str | None = None, newline: str | None = None) -> IO:
    """`open(path, mode)` for writing ("w", "a" or "x", text or "b"), where a full disk is a DiskFullError
    naming `shown` (default: `path`), not a bare "No space left on device"."""
    if "r" in mode or "+" in mode:
        raise ValueError(f"open_named writes only: mode {mode!r}")
    raw = _NamedFile(path, mode.replace("b", "").replace("t", ""), path if shown is None else shown)
    buffered = io.BufferedWriter(raw)
    return buffered if "b" in mode else io.TextIOWrapper(buffered, encoding=encoding, errors=errors, newline=newline)


@contextlib.contextmanager
def writing(path: str | Path, mode: str = "w", shown: str | Path | None = None, **kwargs: Any) -> Iterator[IO]:
    """`with open_named(...) as f`, and a full disk that the block's writer swallowed is still raised as one."""
    f = open_named(path, mode, shown, **kwargs)
    try:
        with f:
            yield f
    except Exception as e:  # noqa: BLE001 - only a full disk is changed
        raw = f.raw if isinstance(f, io.BufferedWriter) else f.buffer.raw
        if raw.full is None or e is raw.full:
            raise
        raise DiskFullError(raw.full.path, raw.full.reason, raw.full.errno) from e


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def ensure_writable_dir(path: str | Path) -> Path:
    """Create `path` (and parents) or fail with a message naming it, before any work starts."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise DataError(f"output directory {path} is not writable: {e.strerror or e}") from None
    return path


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; rename it to `path` only on success."""
    path = Path(path)
    tmp = _tmp_name(path)
    try:
        with naming_full_disk(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            with writing(tmp, mode, shown=path, **kwargs) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Build a directory under a temporary name and rename it to `path` when the block succeeds.

    An existing directory at `path` is replaced only after the new one is complete. A full disk met in the
    block names the file by its final path (`path`/name), or `path` where the writer did not say which.
    """
    path = Path(path)
    with naming_full_disk(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = follow_umask(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        try:
            yield tmp
        except Exception as e:  # noqa: BLE001 - only a full disk is changed
            named = disk_full_error(e, path)
            if named is None:
                raise
            inside = Path(named.path)
            if inside == tmp or tmp in inside.parents:
                named = DiskFullError(path / inside.relative_to(tmp), named.reason, named.errno)
            if named is e:
                raise
            raise named from e
        with naming_full_disk(path):
            replace_dir(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def replace_dir(tmp: Path, path: Path) -> None:
    """Put the finished `tmp` at `path`, replacing what is there only now."""
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


@contextlib.contextmanager
def writer_lock(directory: str | Path, name: str = ".lock", create: bool = True) -> Iterator[None]:
    """Hold an exclusive advisory lock on `directory` (one writer at a time); the kernel releases it when
    the process ends, however it ends, so a killed writer never leaves a stale lock behind.

    A second process asking for the same lock gets a DataError naming the holder's pid at once. With
    `create=False` a missing directory is not created (and nothing is locked)."""
    import fcntl

    directory = Path(directory)
    if not directory.exists():
        if not create:
            yield
            return
        ensure_writable_dir(directory)
    path = directory / name
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise DataError(f"{directory}: cannot create the lock file {name} ({e.strerror or e})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise DataError(f"{directory} is being written by another process (pid {holder}): one writer per "
                            "run directory; wait for it to finish or choose another directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def read_text(path: str | Path, error: type[Exception] = DataError) -> str:
    """A UTF-8 text file's contents; a missing, unreadable or non-UTF-8 file is `error` naming it and why."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, expected a file") from None
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise error(f"{path}: not UTF-8 text (line {line}: byte 0x{data[e.start]:02x} at offset {e.start})") from None


def read_json(path: str | Path, expect: type | tuple[type, ...] | None = None,
              error: type[Exception] = DataError) -> Any:
    """Parse a JSON file; with `expect`, also refuse a value of another type (a list where an object belongs).

    Every way a file can be bad (missing, not UTF-8, invalid JSON, an integer too long to convert,
    nesting too deep, the wrong shape) is `error` naming the file and the reason, never a traceback."""
    return parse_json(read_text(path, error), path, expect, error)


def parse_json(text: str, where: str | Path, expect: type | tuple[type, ...] | None = None,
               error: type[Exception] = DataError) -> Any:
    """`read_json` for text already read; `where` names its origin in every message."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}:{e.lineno}: invalid JSON: {e.msg}") from None
    except RecursionError:
        raise error(f"{where}: invalid JSON: nested too deeply") from None
    except ValueError as e:  # e.g. an integer of more than 4,300 digits
        raise error(f"{where}: invalid JSON: {str(e).split(';')[0]}") from None
    if expect is not None and not isinstance(value, expect):
        names = " or ".join(t.__name__ for t in (expect if isinstance(expect, tuple) else (expect,)))
        kinds = {"dict": "a JSON object", "list": "a JSON list", "str": "a JSON string"}
        raise error(f"{where}: expected {kinds.get(names, names)}, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}")


def open_compressed(path: str | Path) -> IO[bytes]:
    """Open a file for binary reading, decompressing `.gz` and `.zst` transparently."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".zst") or name.endswith(".zstd"):
        import zstandard

        raw = open(path, "rb")
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return open(path, "rb")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
