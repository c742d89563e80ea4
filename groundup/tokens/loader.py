"""The training loader: memory-mapped token shards in, (inputs, targets) batches out.

    loader = TokenLoader("out/tokens", "train", seq_len=256, batch_size=16, rank=rank, world_size=world,
                         seed=0, domain_weights={"text": 0.5, "code": 0.3, "math": 0.2},
                         expected_tokenizer_hash=tok.hash)
    batch = next(loader)          # Batch(inputs, targets, docs, domains)
    batch.inputs, batch.targets   # int64 tensors (batch_size, seq_len); targets are inputs shifted by one
    batch.docs[i]                 # document numbers row i touches; loader.document_names(...) -> record ids
    state = loader.state_dict()   # plain ints/strings: torch.save it, torch.load(weights_only=True) it back
    loader.load_state_dict(state) # the next batch is exactly the one that would have come next

Sampling. Each row first picks a domain: by `domain_weights` (normalised; domains missing from the
dict are not sampled), or in proportion to each domain's tokens when None. The domain choice for
batch n on rank r comes from a generator seeded by (seed, r, n), so it needs no saved RNG state.
Within a domain, an epoch is a seeded permutation of its windows, the same on every rank; rank r
takes every world_size-th window from position r, so ranks read disjoint data. A domain's windows:
  - plain packing: seq_len+1 tokens at a random offset plus multiples of seq_len (so windows overlap
    by the one token that is both the last target and the next first input), wrapping at the end;
  - `bos_aligned=True`: one window per document, starting at it: each document is preceded by the
    begin-of-text id, documents follow each other in the row, and a document longer than the row
    is cut (its tail is not trained on; use it when most documents fit in seq_len). A model trained
    this way expects prompts to start with the begin-of-text id.
A domain whose epoch ends starts its next epoch (new permutation, new offset); `epochs` counts them.

State (`state_dict`): version, batch (batches drawn), cursors {domain: [epoch, position]} where
position p on rank r means windows r, r+W, ..., r+(p-1)W of the epoch's permutation (W =
world_size; the permutation does not depend on W, which lets a checkpoint be re-sharded), plus
the settings that must match to resume: split, seq_len, batch_size, rank, world_size, seed,
bos_aligned, weights, tokenizer_hash and the split's token count.

Validation: `eval_batches(domain=None)` walks the split's token stream of each domain (or of one)
in fixed windows of seq_len+1 with stride seq_len, led by an end-of-text id so that every token of
the split is a target exactly once; the last window is padded with IGNORE_INDEX targets, and rank r
gets windows r, r+world_size, ... with every rank yielding the same number of batches (rows with
nothing left are all IGNORE_INDEX). Bits per byte: sum of target losses / (ln 2 * sum of
`Tokenizer.token_bytes()[targets]`); the byte sum over a domain equals `val_bytes(domain)`.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import torch

from groundup.tokens.shards import ShardFile, check_tokenizer, document_ids, open_split, read_index
from groundup.errors import DataError

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default ignore_index
STATE_VERSION = 1


class Batch(NamedTuple):
    inputs: torch.Tensor  # (B, T) int64
    targets: torch.Tensor  # (B, T) int64, IGNORE_INDEX where there is nothing to predict
    docs: list[list[int]]  # per row: split-level numbers of the documents its tokens come from
    domains: list[str]  # per row: the domain it was drawn from


class _Domain:
    """One domain's files of a split seen as one token stream, with its document starts."""

    def __init__(self, name: str, files: list[ShardFile]):
        self.name, self.files = name, files
        lengths = [len(f.tokens) for f in files]
        self.bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.tokens = int(self.bounds[-1])
        self.doc_starts = np.concatenate([f.starts[:-1] + b for f, b in zip(files, self.bounds)]).astype(np.int64)
        self.doc_numbers = np.concatenate([np.arange(f.documents) + f.first_doc for f in files]).astype(np.int64)
        self.key = zlib.crc32(name.encode("utf-8"))  # seeds this domain's permutations by name, not position

    def read(self, start: int, n: int, wrap: bool = True) -> np.ndarray:
        """Tokens [start, start+n) of the stream as int64, wrapping to the start (or stopping at the end)."""
        if not wrap:
            n = max(0, min(n, self.tokens - start))
        out = np.empty(n, dtype=np.int64)
        filled = 0
        while filled < n:
            pos = (start + filled) % self.tokens
            k = int(np.searchsorted(self.bounds, pos, side="right")) - 1
            take = min(n - filled, int(self.bounds[k + 1]) - pos)
            local = pos - int(self.bounds[k])
            out[filled : filled + take] = self.files[k].tokens[local : local + take]
            filled += take
        return out

    def docs(self, start: int, n: int) -> list[int]:
        """Document numbers of stream positions [start, start+n), wrapping, in order, each once."""
        found: list[int] = []
        for s, e in _spans(start % self.tokens, n, self.tokens):
            lo = int(np.searchsorted(self.doc_starts, s, side="right")) - 1
            hi = int(np.searchsorted(self.doc_starts, e - 1, side="right"))
            found.extend(int(d) for d in self.doc_numbers[lo:hi] if int(d) not in found)
        return found


def _spans(start: int, n: int, size: int) -> list[tuple[int, int]]:
    """[start, start+n) on a ring of `size` as plain intervals."""
    spans, pos, left = [], start, min(n, size)
    while left > 0:
        take = min(left, size - pos)
        spans.append((pos, pos + take))
        left -= take
        pos = 0
    return spans


def _insert_bos(raw: np.ndarray, eot: int, bos: int, n: int, lead: bool, at_end: bool) -> tuple[np.ndarray, int]:
    """The first n tokens of `raw` with `bos` before it (when `lead`) and after every end-of-text id
    except a final one that ends the domain; also how many tokens of `raw` made it into them."""
    after = np.flatnonzero(raw == eot) + 1
    if at_end and len(after) and after[-1] == len(raw):
        after = after[:-1]
    out = np.insert(raw, after, bos)
    if lead:
        out = np.concatenate([[bos], out])
    out = out[:n]
    inserted = after + np.arange(len(after)) + int(lead)  # positions of the inserted ids in `out`
    return out, len(out) - int(lead) - int((inserted < n).sum())


class TokenLoader:
    def __init__(self, shard_dir: str | Path, split: str = "train", seq_len: int = 1024, batch_size: int = 8, *,
                 rank: int = 0, world_size: int = 1, seed: int = 0, domain_weights: dict[str, float] | None = None,
                 bos_aligned: bool = False, expected_tokenizer_hash: str | None = None):
        if seq_len < 1 or batch_size < 1:
            raise DataError(f"seq_len and batch_size must be positive (got {seq_len}, {batch_size})")
        if not 0 <= rank < world_size:
            raise DataError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")
        self.shard_dir = Path(shard_dir)
        self.index = read_index(self.shard_dir)
        check_tokenizer(self.index, expected_tokenizer_hash, self.shard_dir)
        self.split, self.seq_len, self.batch_size = split, seq_len, batch_size
        self.rank, self.world_size, self.seed, self.bos_aligned = rank, world_size, seed, bos_aligned
        self.eot_id = int(self.index["eot_id"])
        bos = self.index.get("bos_id")
        if bos_aligned and bos is None:
            raise DataError(f"{self.shard_dir}: bos_aligned needs a tokenizer with a begin-of-text token, and the "
                            "shards' tokenizer has none (documents are still separated by end-of-text)")
        self.bos_id = int(bos) if bos is not None else None
        self.vocab_size = int(self.index["vocab_size"])
        self.files = open_split(self.shard_dir, split, self.index)
        by_domain: dict[str, list[ShardFile]] = {}
        for f in self.files:
            by_domain.setdefault(f.domain, []).append(f)
        self._domains = {name: _Domain(name, fs) for name, fs in sorted(by_domain.items())}
        if not self._domains:
            raise DataError(f"{self.shard_dir}: split {split!r} holds no tokens")
        self.domains = list(self._domains)
        self.weights = self._weights(domain_weights)
        self._sampled = [d for d in self.domains if self.weights[d] > 0]
        self._p = np.array([self.weights[d] for d in self._sampled])
        self._batch = 0
        self._cursor = {d: [0, 0] for d in self.domains}  # domain -> [epoch, position in this rank's order]
        self._order_cache: dict[str, tuple[int, np.ndarray]] = {}
        if split == "train":  # fail now, not after model setup, if a domain is too small for the ranks;
            for d in self._sampled:  # a validation split only needs eval_batches, which any size allows
                self._order(d, 0)

    # ------------------------------------------------------------------ sampling

    def _weights(self, given: dict[str, float] | None) -> dict[str, float]:
        if given is None:
            total = sum(d.tokens for d in self._domains.values())
            return {name: d.tokens / total for name, d in self._domains.items()}
        unknown = sorted(set(given) - set(self._domains))
        if unknown:
            raise DataError(f"domain_weights names {unknown}, not in split {self.split!r} of {self.shard_dir}; "
                            f"its domains are {self.domains}")
        if any(not (w >= 0 and math.isfinite(w)) for w in given.values()) or sum(given.values()) <= 0:
            raise DataError(f"domain_weights {given}: weights must be finite, >= 0, and not all 0")
        total = sum(given.values())
        return {name: given.get(name, 0.0) / total for name in self._domains}

    def _order(self, name: str, epoch: int) -> np.ndarray:
        """This rank's window starts for `name` in `epoch` (stream positions), cached for the epoch."""
        cached = self._order_cache.get(name)
        if cached and cached[0] == epoch:
            return cached[1]
        d, T = self._domains[name], self.seq_len
        rng = np.random.default_rng([self.seed, d.key, epoch])
        if self.bos_aligned:
            starts = d.doc_starts
        else:  # a fresh offset each epoch, so window edges fall elsewhere in the text
            offset = int(rng.integers(d.tokens))
            starts = (offset + np.arange(max(1, (d.tokens - 1) // T), dtype=np.int64) * T) % d.tokens
        mine = starts[rng.permutation(len(starts))][self.rank :: self.world_size]
        mine = mine[: len(starts) // self.world_size]  # equal counts: ranks stay in step and disjoint
        if len(mine) == 0:
            unit = "documents" if self.bos_aligned else f"windows of seq_len {T}"
            raise DataError(f"{self.shard_dir}: domain {name!r} of split {self.split!r} has {len(starts)} {unit}, "
                            f"fewer than world_size {self.world_size}: lower seq_len or add data")
        self._order_cache[name] = (epoch, mine)
        return mine

    def _row(self, name: str) -> tuple[np.ndarray, list[int]]:
        d, cursor = self._domains[name], self._cursor[name]
        order = self._order(name, cursor[0])
        if cursor[1] >= len(order):
            cursor[0], cursor[1] = cursor[0] + 1, 0
            order = self._order(name, cursor[0])
        start = int(order[cursor[1]])
        cursor[1] += 1
        if not self.bos_aligned:
            return d.read(start, self.seq_len + 1), d.docs(start, self.seq_len + 1)
        raw = d.read(start, self.seq_len)  # the leading begin-of-text makes it seq_len+1 or more
        row, used = _insert_bos(raw, self.eot_id, self.bos_id, self.seq_len + 1, lead=True, at_end=False)
        return row, d.docs(start, used)

    def next_batch(self) -> Batch:
        if len(self._sampled) == 1:
            names = self._sampled * self.batch_size
        else:
            rng = np.random.default_rng([self.seed, self.rank, self._batch, 1])
            names = [self._sampled[i] for i in rng.choice(len(self._sampled), size=self.batch_size, p=self._p)]
        self._batch += 1
        rows, docs = zip(*(self._row(n) for n in names))
        x = torch.from_numpy(np.stack(rows))
        return Batch(x[:, :-1].contiguous(), x[:, 1:].contiguous(), list(docs), names)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        return self.next_batch()

    @property
    def epochs(self) -> dict[str, int]:
        """Completed epochs per domain on this rank."""
        return {d: c[0] for d, c in self._cursor.items()}

    @property
    def tokens_per_batch(self) -> int:
        return self.batch_size * self.seq_len

    # ------------------------------------------------------------------ state

    def _identity(self) -> dict:
        return {"split": self.split, "seq_len": self.seq_len, "batch_size": self.batch_size, "rank": self.rank,
                "world_size": self.world_size, "seed": self.seed, "bos_aligned": self.bos_aligned,
                "weights": {d: float(w) for d, w in self.weights.items()},
                "tokenizer_hash": self.index["tokenizer_hash"],
                "tokens": int(self.index["splits"][self.split]["tokens"])}

    def state_dict(self) -> dict:
        """Position and settings as plain Python data (safe for torch.load(weights_only=True))."""
        return {"version": STATE_VERSION, "batch": self._batch,
                "cursors": {d: list(c) for d, c in self._cursor.items()}, **self._identity()}

    def load_state_dict(self, state: dict) -> None:
        """Resume exactly; refuses a state saved with other data or sampling settings."""
        if state.get("version") != STATE_VERSION:
            raise DataError(f"loader state version {state.get('version')!r}, expected {STATE_VERSION}")
        mine = self._identity()
        differ = [f"{k}: saved {state.get(k)!r}, now {v!r}" for k, v in mine.items() if state.get(k) != v]
        if differ:
            raise DataError("cannot resume the data loader, it was saved with other settings or data: "
                            + "; ".join(differ))
        if set(state["cursors"]) != set(self._cursor):
            raise DataError(f"loader state domains {sorted(state['cursors'])} differ from {self.domains}")
        self._batch = int(state["batch"])
        self._cursor = {d: [int(c[0]), int(c[1])] for d, c in state["cursors"].items()}

    # ------------------------------------------------------------------ validation

    def _stream_length(self, d: _Domain) -> int:
        # The stream is led by one token (end-of-text, or begin-of-text before every document).
        return d.tokens + (len(d.doc_starts) if self.bos_aligned else 1)

    def _stream(self, d: _Domain, a: int, n: int) -> tuple[np.ndarray, list[int]]:
        """Up to n tokens of the validation stream from position a, and the documents they touch."""
        if not self.bos_aligned:
            lead = np.array([self.eot_id] if a == 0 else [], dtype=np.int64)
            raw_start = max(a - 1, 0)
            raw = d.read(raw_start, n - len(lead), wrap=False)
            return np.concatenate([lead, raw]), d.docs(raw_start, len(raw))
        bos_at = d.doc_starts + np.arange(len(d.doc_starts))  # where each document's begin-of-text sits
        i = int(np.searchsorted(bos_at, a, side="right")) - 1
        off = a - int(bos_at[i])  # 0: the window starts on that begin-of-text
        raw_start = int(d.doc_starts[i]) + max(off - 1, 0)
        raw = d.read(raw_start, n, wrap=False)
        at_end = raw_start + len(raw) == d.tokens
        row, used = _insert_bos(raw, self.eot_id, self.bos_id, n, lead=off == 0, at_end=at_end)
        return row, d.docs(raw_start, used)

    def eval_batches(self, domain: str | None = None, max_batches: int | None = None) -> Iterator[Batch]:
        """Deterministic batches covering the split (or one domain of it) once; see the module docstring."""
        if domain is not None and domain not in self._domains:
            raise DataError(f"no domain {domain!r} in split {self.split!r}; it has {self.domains}")
        T = self.seq_len
        windows = [(name, k * T) for name in ([domain] if domain else self.domains)
                   for k in range(math.ceil((self._stream_length(self._domains[name]) - 1) / T))]
        per_rank = math.ceil(len(windows) / self.world_size)
        mine = windows[self.rank :: self.world_size]
        n_batches = math.ceil(per_rank / self.batch_size)
        if max_batches is not None:
            n_batches = min(n_batches, max_batches)
        for b in range(n_batches):
            x = np.full((self.batch_size, T + 1), IGNORE_INDEX, dtype=np.int64)
            docs: list[list[int]] = [[] for _ in range(self.batch_size)]
            names = [""] * self.batch_size
            for i, (name, a) in enumerate(mine[b * self.batch_size : (b + 1) * self.batch_size]):
                d = self._domains[name]
                row, docs[i] = self._stream(d, a, T + 1)
                x[i, : len(row)] = row
                names[i] = name
            inputs = torch.from_numpy(np.where(x[:, :-1] == IGNORE_INDEX, self.eot_id, x[:, :-1]))
            yield Batch(inputs, torch.from_numpy(x[:, 1:].copy()), docs, names)

    def val_bytes(self, domain: str | None = None) -> int:
        """UTF-8 bytes of the split's text (or one domain's): bits-per-byte's denominator."""
        info = self.index["splits"][self.split]
        return int(info["bytes"] if domain is None else info["domains"][domain]["bytes"])

    def document_names(self, docs: list[int]) -> list[str]:
        """Record ids of document numbers as found in `Batch.docs`."""
        return document_ids(self.files, list(docs))
