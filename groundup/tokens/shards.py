"""Token shards: flat token files, their index, writing them (`groundup data tokenize`) and reading them.

    index = tokenize_to_shards(["out/curated/shards"], "out/tokenizer", "out/tokens")
    (the function behind `groundup data tokenize`, whose command line is in groundup/tokens/commands.py;
    `executor="ray"` encodes on a Ray cluster, one task per input file: tokens/ray_tokenize.py)

Layout of the output directory:

    index.json                        written last: it lists only complete files
    train/<domain>-00000.bin          flat little-endian uint16 (vocab_size <= 65,536) or uint32 ids
    train/<domain>-00000.docs.npy     int64 start offset of each document in the .bin, then its length
    train/<domain>-00000.ids.jsonl    each document's record id, one JSON string per line
    val/...                           the same for the validation split

Each document is its tokens followed by the end-of-text id (groundup's <|end_of_text|>, or a Hugging
Face tokenizer's eos token; `bos_id` is None for one without a bos, such as Qwen's); a document never
spans two files and each file holds one domain, so the loader can weight domains by choosing among
files. Files are written under temporary names and renamed when complete; a previous index.json is
deleted before the first file is renamed over its predecessor, so a crash never leaves an index
vouching for files it does not describe.

index.json keys: format, version, dtype, vocab_size, eot_id, bos_id, tokenizer_hash, tokenizer,
val_fraction, seed, split_rule, tokens, documents, bytes, skipped_empty, read (the reader's counts of
bad records), inputs, seconds, and splits.{train,val}: tokens, documents, bytes (UTF-8 bytes of the
text, the denominator of bits-per-byte), domains.<domain> and sources.<source> (each with tokens,
documents, bytes), and shards: [{file, offsets, ids, domain, tokens, documents, bytes}] (paths
relative to the directory). Token counts include the end-of-text separators.

Split: a document goes to val when xxh64(its UTF-8 text, seed) / 2**64 < val_fraction, so the
split depends on the text alone (identical documents land together) and not on input order or
worker count. Each split gets at least one document: the lowest-scoring document is moved to val
if val would be empty, the highest-scoring to train if train would be.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from groundup.config import fail
from groundup.data.hashing import document_score
from groundup.data.readers import ReadStats, check_inputs
from groundup.errors import DataError
from groundup.io import atomic_write_json, read_json, writer_lock
from groundup.layout import mark_output_dir
from groundup.ray_cluster import ray_session
from groundup.schema import check, relative_file
from groundup.tokenizer import BaseTokenizer, load_tokenizer
from groundup.tokens.ray_tokenize import discard_work, encode_on_ray
from groundup.tokens.writer import INDEX_FILE, SPLITS, encode_here, remove_stale, write_splits

FORMAT = "groundup-token-shards"
SPLIT_SCORE = document_score  # the split rule's score (also imported from here as document_score)
SPLIT_RULE = ("val when xxh64(utf-8 text, seed) / 2**64 < val_fraction; the lowest-scoring document "
              "goes to val if val would be empty, the highest-scoring to train if train would be")


@dataclasses.dataclass
class TokenizeConfig:
    val_fraction: float = 0.01  # share of documents in the validation split (at least one)
    seed: int = 0  # of the document hash that decides the split
    workers: int = 0  # encoding processes; 0: one per core
    shard_tokens: int = 1 << 27  # start a new file after this many tokens (256 MB at uint16)
    batch_bytes: int = 1 << 20  # text per unit of work sent to an encoding process
    default_domain: str | None = None  # domain of records that name none (default: "text")
    # Keep documents together in one split: a record field naming each document's group (e.g. "work":
    # every chunk and edition of a play); records without it split alone. Curated shards keep such
    # fields in their `meta` column, which is read too.
    split_group: str = ""
    split_group_fraction: float = 0.0  # the share of groups held out; 0: val_fraction
    # --executor ray: one task per input file, smaller files grouped to at least this many bytes on
    # disk (data/input_tasks.py). Only the number of Ray tasks depends on it, never the output.
    task_bytes: int = 1 << 20

    def validate(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            fail("val_fraction", self.val_fraction, "a number in [0, 1)")
        if self.workers < 0:
            fail("workers", self.workers, "an integer >= 0 (0: one per core)")
        if self.shard_tokens < 1:
            fail("shard_tokens", self.shard_tokens, "a positive integer")
        if self.batch_bytes < 1:
            fail("batch_bytes", self.batch_bytes, "a positive integer")
        if not 0.0 <= self.split_group_fraction < 1.0:
            fail("split_group_fraction", self.split_group_fraction, "a number in [0, 1) (0: val_fraction)")
        if self.task_bytes < 1:
            fail("task_bytes", self.task_bytes, "a positive integer")



def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def tokenize_to_shards(inputs: list[str | Path], tokenizer, out: str | Path, cfg: TokenizeConfig | None = None,
                       progress: bool = True, executor: str = "local", address: str | None = None) -> dict:
    """Encode the records of `inputs` into token shards under `out`; returns the index written.

    `executor="ray"` encodes one Ray task per input file on the cluster at `address` (None: a Ray
    instance started here) and writes the same files (tokens/ray_tokenize.py)."""

    cfg = cfg or TokenizeConfig()
    cfg.validate()
    inputs = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    if executor not in ("local", "ray"):
        raise DataError(f"executor {executor!r}: expected local or ray")
    if executor == "local" and address:
        raise DataError(f"--address {address}: only --executor ray connects to a cluster")
    given = isinstance(tokenizer, BaseTokenizer)
    tok = tokenizer if given else load_tokenizer(tokenizer)
    if tok.eot_id is None:  # either backend: groundup's always has one, a Hugging Face one names its eos token
        raise DataError(f"{tokenizer}: the tokenizer has no end-of-text (eos) token to separate documents; name "
                        "one as eos_token in its tokenizer_config.json")
    check_inputs(inputs)
    dtype = token_dtype(tok.vocab_size)
    start = time.perf_counter()
    stats, skipped = ReadStats(), collections.Counter()
    with contextlib.ExitStack() as stack:
        if executor == "ray":  # connect first: a wrong --address leaves nothing behind
            stack.enter_context(ray_session(address))
        out = mark_output_dir(out, "data tokenize")
        stack.enter_context(writer_lock(out))
        for split in SPLITS:
            (out / split).mkdir(exist_ok=True)
        if executor == "ray":
            batches = encode_on_ray(inputs, tok, out, cfg, dtype, stats, skipped, progress)
        else:
            batches = encode_here(inputs, tok, cfg, dtype, stats, skipped, progress)
        splits, groups = write_splits(batches, out, cfg, ", ".join(map(str, inputs)))
        index = {
            "format": FORMAT, "version": 1, "dtype": dtype.name, "vocab_size": tok.vocab_size,
            "eot_id": tok.eot_id, "bos_id": tok.bos_id, "tokenizer_hash": tok.hash,
            "tokenizer": None if given else str(tokenizer),
            "val_fraction": cfg.val_fraction, "seed": cfg.seed, "split_rule": SPLIT_RULE,
            **{k: sum(splits[s][k] for s in SPLITS) for k in ("tokens", "documents", "bytes")},
            "skipped_empty": skipped["empty"], "read": stats.to_dict(), "inputs": [str(p) for p in inputs],
            "seconds": round(time.perf_counter() - start, 3), "splits": splits,
            "split_group": cfg.split_group or None,
            "groups": {s: sorted(g) for s, g in groups.items()} if cfg.split_group else None,
        }
        atomic_write_json(out / INDEX_FILE, index)
        remove_stale(out, index)
        discard_work(out)  # the index is written: a Ray run's encoded files are no longer needed
    return index


# ----------------------------------------------------------------------------- reading


@dataclasses.dataclass
class ShardFile:
    """One .bin file of a split, opened for reading: tokens memory-mapped, document starts loaded."""

    path: Path
    domain: str
    tokens: np.ndarray  # memmap of the flat ids
    starts: np.ndarray  # int64 start of each document, then the file's length
    first_doc: int  # index of this file's first document among all documents of the split
    ids_path: Path

    @property
    def documents(self) -> int:
        return len(self.starts) - 1


_SHARD = {"file": str, "offsets": str, "ids": str, "domain": str, "tokens": int, "documents?": int, "bytes?": int}
_SPLIT = {"tokens": int, "documents": int, "bytes": int, "domains?": dict, "sources?": dict, "shards": [_SHARD]}
INDEX_SCHEMA = {"format": str, "dtype": str, "vocab_size": int, "eot_id": int, "bos_id?": (int, None),
                "tokenizer_hash?": (str, None), "splits": {"train?": _SPLIT, "val?": _SPLIT}}


def read_index(shard_dir: str | Path) -> dict:
    """The index of a shard directory; DataError when missing (not shards, or tokenize did not finish)."""
    path = Path(shard_dir) / INDEX_FILE
    if not path.is_file():
        raise DataError(f"{path}: no index: not a token shard directory, or 'groundup data tokenize' "
                        "did not finish (the index is written last)")
    index = read_json(path, expect=dict)
    if index.get("format") != FORMAT:
        raise DataError(f"{path}: format {index.get('format')!r} is not {FORMAT!r}")
    check(index, INDEX_SCHEMA, str(path))
    if index["dtype"] not in ("uint16", "uint32"):
        raise DataError(f"{path}: dtype = {index['dtype']!r}: expected uint16 or uint32")
    for split in index["splits"].values():
        for i, entry in enumerate(split["shards"]):
            for key in ("file", "offsets", "ids"):
                relative_file(entry[key], str(path), f"shards[{i}].{key}")
            if entry["tokens"] < 0:
                raise DataError(f"{path}: shards[{i}].tokens = {entry['tokens']}: expected a count >= 0")
    return index


def check_tokenizer(index: dict, expected_hash: str | None, where: str | Path) -> None:
    """Refuse shards made by another tokenizer than the run's (naming both hashes)."""
    if expected_hash is not None and index.get("tokenizer_hash") != expected_hash:
        raise DataError(f"{where}: token shards were made by tokenizer {index.get('tokenizer_hash')}, but this "
                        f"run uses tokenizer {expected_hash}; re-run 'groundup data tokenize' with the run's "
                        "tokenizer")


def open_split(shard_dir: str | Path, split: str, index: dict | None = None) -> list[ShardFile]:
    """Open every file of `split` (train or val), checking each file's size against the index."""
    shard_dir = Path(shard_dir)
    index = index or read_index(shard_dir)
    if split not in index["splits"]:
        raise DataError(f"{shard_dir}: no split {split!r}; the index has {', '.join(index['splits'])}")
    dtype = np.dtype(index["dtype"]).newbyteorder("<")
    files, first = [], 0
    for entry in index["splits"][split]["shards"]:
        path = shard_dir / entry["file"]
        size = path.stat().st_size if path.is_file() else -1
        if size != entry["tokens"] * dtype.itemsize:
            raise DataError(f"{path}: {'missing' if size < 0 else f'{size:,} bytes'}, but the index says "
                            f"{entry['tokens']:,} tokens of {dtype.name}: the shard directory is damaged")
        starts = np.load(shard_dir / entry["offsets"], allow_pickle=False)
        tokens = np.memmap(path, dtype=dtype, mode="r")
        files.append(ShardFile(path, entry["domain"], tokens, starts, first, shard_dir / entry["ids"]))
        first += len(starts) - 1
    return files


def document_ids(files: list[ShardFile], docs: list[int]) -> list[str]:
    """Record ids of documents numbered as `ShardFile.first_doc` counts them (reads the ids files)."""
    wanted, found = set(docs), {}
    for f in files:
        hits = [d for d in wanted if f.first_doc <= d < f.first_doc + f.documents]
        if hits:
            with open(f.ids_path, encoding="utf-8") as fh:
                lines = fh.readlines()
            found.update({d: json.loads(lines[d - f.first_doc]) for d in hits})
    return [found.get(d, f"#{d}") for d in docs]


def shards_tokenizer(shard_dir: Path, index: dict):
    """The tokenizer the shards' index names (as given, or relative to the shards), if it is found and
    its hash is the one the shards were made with; else None."""

    named = index.get("tokenizer")
    for path in ([Path(named), Path(shard_dir) / named] if named else []):
        try:
            found = load_tokenizer(path)
        except DataError:
            continue
        if found.hash == index.get("tokenizer_hash"):
            return found
    return None
