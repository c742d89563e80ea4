"""Run a function over batches of texts on several processes, in order, with bounded memory.

    for arrays in map_batches(tok, batches, workers=2):           # one uint32 array per text
        ...
    for result in map_batches(tok, batches, fn, workers=2):       # fn(tok, texts) in each worker
        ...

Processes rather than tiktoken's threads because the caller (reading JSON or Parquet, writing
shards) needs the GIL too: on 2 cores a 2-process pool encodes about 30 MB/s where tiktoken's
thread pool gives about 24 MB/s. At most `2 * workers` batches are in flight, so a large input
never piles up in memory the way `Pool.imap` (which reads its whole input ahead) would let it.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import sys
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from groundup.tokenizer.base import BaseTokenizer

_worker_tok: BaseTokenizer | None = None


def encode_arrays(tok: BaseTokenizer, texts: list[str]) -> list[np.ndarray]:
    return [tok.encode_to_numpy(t) for t in texts]


def _init(tok: BaseTokenizer) -> None:
    global _worker_tok
    _worker_tok = tok


def _call(fn: Callable, texts: list[str]) -> Any:
    return fn(_worker_tok, texts)


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def start_context():
    """How worker processes start. fork starts one in milliseconds (spawn takes about a second, longer
    than encoding the whole embedded corpus), but a process connected to Ray carries its client's
    threads, and a child forked while one of them holds a lock can wait on it forever: such a process
    spawns. The initializer passes the tokenizer, which both backends pickle as the parts they are
    rebuilt from, so spawn works too."""
    ray = sys.modules.get("ray")
    ray_connected = ray is not None and getattr(ray, "is_initialized", lambda: False)()
    fork = "fork" in multiprocessing.get_all_start_methods() and not ray_connected
    return multiprocessing.get_context("fork" if fork else "spawn")


def map_batches(tok: BaseTokenizer, batches: Iterable[list[str]],
                fn: Callable[[BaseTokenizer, list[str]], Any] = encode_arrays,
                workers: int = 0) -> Iterator[Any]:
    """Yield `fn(tok, batch)` for each batch, in input order. `fn` must be a module-level function
    (it is sent to the workers by name). `workers` 0 means one per available core; 1 runs here."""
    workers = workers or default_workers()
    if workers <= 1:
        for batch in batches:
            yield fn(tok, batch)
        return
    with start_context().Pool(workers, initializer=_init, initargs=(tok,)) as pool:
        pending: collections.deque = collections.deque()
        for batch in batches:
            pending.append(pool.apply_async(_call, (fn, batch)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
