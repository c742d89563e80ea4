"""Write one curated output shard: `shards/part-NNNNN.parquet` (or `.jsonl`).

Columns: id, source, domain, text, url (null when absent), language (code files), quality (the
classifier's score, when one ran) and meta (the record's other fields as a JSON object). A
document the mixing plan repeats appears several times, with rows shuffled (seeded) so copies
are not adjacent. The file is written under a temporary name and renamed, and an existing part
is left alone: the counts for the report are recomputed from the copies, which are deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from groundup.data.curate_config import CurateConfig
from groundup.data.substring_dedup import apply_removals, load_removals, removed_per_row
from groundup.io import atomic_open

OUTPUT_COLUMNS = ("id", "source", "domain", "text", "url", "language", "quality", "meta")


def record_field(record: dict, name: str):
    """A record's field, top-level or inside a curated shard's `meta` JSON (None when absent)."""
    if name in record:
        return record[name]
    meta = record.get("meta")
    if isinstance(meta, str) and name in meta:
        try:
            meta = json.loads(meta)
        except ValueError:
            return None
    return meta.get(name) if isinstance(meta, dict) else None


def output_path(shards_dir: Path, index: int, fmt: str) -> Path:
    return shards_dir / f"part-{index:05d}.{'parquet' if fmt == 'parquet' else 'jsonl'}"


def write_output_shard(stage: Path, shards_dir: Path, index: int, copies: np.ndarray, cfg: CurateConfig,
                       removals: Path | None = None) -> dict:
    """Write each row of the work shard `copies[row]` times, with the substring-dedup cuts in `removals`
    (data/substring_dedup.py) made; returns {"path", "skipped", "docs", "by_domain", "by_source"} for the report."""
    path = output_path(shards_dir, index, cfg.output.format)
    columns = None if not path.exists() else ["source", "domain", "nbytes"]
    table = pq.read_table(stage, columns=columns)
    rows = np.repeat(np.arange(table.num_rows), copies)
    if cfg.output.shuffle and len(rows) > 1:
        rows = np.random.default_rng([cfg.seed, index]).permutation(rows)
    cuts = load_removals(removals)
    sizes = table.column("nbytes").to_numpy() - removed_per_row(cuts, table.num_rows)
    counts = {"by_domain": {}, "by_source": {}}
    for group, column in (("by_domain", "domain"), ("by_source", "source")):
        values = np.array(table.column(column).to_pylist(), dtype=object)
        for value in sorted(set(values[rows].tolist())) if len(rows) else []:
            sel = values[rows] == value
            counts[group][value] = {"docs": int(sel.sum()), "bytes": int(sizes[rows][sel].sum())}
    info = {"path": path.name, "skipped": columns is not None, "docs": int(len(rows)), **counts}
    if columns is not None or len(rows) == 0:
        return info
    if len(cuts):
        texts = apply_removals(table.column("text").to_pylist(), cuts)
        table = table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts, pa.string()))
    out = table.select(list(OUTPUT_COLUMNS)).take(pa.array(rows, type=pa.int64()))
    if cfg.output.format == "parquet":
        compression = None if cfg.output.compression == "none" else cfg.output.compression
        with atomic_open(path, "wb") as f:
            pq.write_table(out, f, compression=compression)
    else:
        with atomic_open(path, "w", encoding="utf-8") as f:
            for row in out.to_pylist():
                f.write(json.dumps({k: v for k, v in row.items() if v is not None}, ensure_ascii=False) + "\n")
    return info
