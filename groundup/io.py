"""File helpers every stage uses: atomic writes, compressed text, checksums.

A crash must never leave a half-written file that looks complete, so outputs are written under
a temporary name in the same directory and renamed into place (rename is atomic on POSIX).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from groundup.errors import DataError


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


def check_out_dir(out: str | Path, overwrite: bool = False, sources: Iterable[str | Path] = ()) -> Path:
    """The rule every verb that writes a directory keeps: never replace a non-empty one it was not told to.

    An --out that exists and holds anything is refused unless `overwrite`, and one that is or contains
    what the verb reads (`sources`) is refused even then: the replacement is renamed into place only
    when complete, which would delete the source the moment it succeeded."""
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


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; rename it to `path` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        with open(tmp, mode, **kwargs) as f:
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

    An existing directory at `path` is replaced only after the new one is complete.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = follow_umask(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


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
