"""The curation report: `report.json` for programs (the demo's report card) and `report.md` for people.

report.json keys:
- `version` (1), `inputs` (paths), `config` ("config.toml", the resolved settings beside it)
- `read`: ReadStats: files, records, bytes, bad_json, invalid_utf8, binary_files, no_text,
  too_long, unsupported_files, bad_field, unreadable_files, each with `*_examples` ("file:line: reason")
- `totals`: {docs_in, bytes_in, docs_kept, bytes_kept, docs_out, bytes_out}: read, surviving
  curation and deduplication, and written (with mixing repeats)
- `domains` / `sources`: the same six numbers per domain / per source
- `stages`: a list in pipeline order (normalize, url, gopher_quality, gopher_repetition, c4,
  fineweb, ngram_repetition, code, math, classifier, classifier_top_fraction, pii, decontaminate,
  exact_dedup, minhash_dedup or simhash_dedup, substring_dedup; only those that ran), each {name,
  applies_to (domains it judged), by_domain and
  by_source ({docs_in, bytes_in, docs_out, bytes_out, reasons: {reason: docs}}), removed_docs,
  removed_bytes, examples ([{id, source, domain, reason, snippet}]), seconds (CPU seconds summed
  over workers), docs_per_s, mb_per_s, extra (stage counters: pii replacements by kind)}
- `dedup`: {exact: {enabled, groups, removed_docs, removed_bytes}, near ("minhash" or "simhash":
  the method that ran, `dedup.near`), and under that name {enabled, ngram, bands and rows (MinHash)
  or k and blocks (SimHash), clusters, removed_docs, removed_bytes, size_histogram: {"2", "3-5",
  "6-10", "11+"}, largest: [{size, members: [{id, source, domain, kept, snippet}]}]}, substring:
  {enabled, min_tokens, domains, pieces, reused, spans, documents_cut, removed_docs (emptied, dropped),
  removed_bytes, removed_bytes_by_domain, removed_bytes_by_source} (data/substring_dedup.py; its stage
  row is `substring_dedup`)}
- `mix`: {weights, max_repeats, target_bytes, rates, notes, available_bytes (per domain after
  dedup), output: {domain: {docs, bytes, share}}}; `share` is the achieved share of bytes
- `shards`: {format, count, written, skipped_existing_parts, skipped_complete_work_shards, files}
- `audit`: {filter: {domain: {docs, would_remove, reasons}}}: filters run without effect on a
  sample (`output.audit_docs` per shard and domain) of the domains they are not configured for
- `timing`: {curate_shards_s, global_s, write_s, total_s, docs_per_s, mb_per_s} (wall clock)
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow.parquet as pq

from groundup.data.curate_config import FILTER_NAMES, CurateConfig
from groundup.data.dedup import DedupResult
from groundup.data.mixing import MixPlan
from groundup.data.readers import PROBLEM_KINDS, ReadStats
from groundup.data.stats import StageStats, totals
from groundup.data.web.warc import WarcStats
from groundup.data.substring_dedup import SubstringResult, markdown_lines as substring_lines, report_section as substring_section
from groundup.io import atomic_write_json, atomic_write_text

STAGE_ORDER = ("extract", "normalize", "url", "language", *FILTER_NAMES, "perplexity", "classifier", "classifier_top_fraction", "pii",
               "decontaminate", "exact_dedup", "minhash_dedup", "simhash_dedup", "substring_dedup")


def _stage_entry(name: str, data: dict) -> dict:
    total = totals(data["by_domain"])
    seconds = data["seconds"]
    return {
        "name": name,
        "applies_to": sorted(data["by_domain"]),
        "by_domain": data["by_domain"],
        "by_source": data["by_source"],
        "removed_docs": total["docs_in"] - total["docs_out"],
        "removed_bytes": total["bytes_in"] - total["bytes_out"],
        "examples": data["examples"],
        "seconds": seconds,
        "docs_per_s": round(total["docs_in"] / seconds, 1) if seconds > 0 else None,
        "mb_per_s": round(total["bytes_in"] / 1e6 / seconds, 2) if seconds > 0 else None,
        "extra": data["extra"],
    }


def _histogram(sizes: Sequence[int]) -> dict:
    bins = {"2": 0, "3-5": 0, "6-10": 0, "11+": 0}
    for s in sizes:
        bins["2" if s == 2 else "3-5" if s <= 5 else "6-10" if s <= 10 else "11+"] += 1
    return bins


def _cluster_examples(result: DedupResult, counts: Sequence[int], stage_files: Sequence[Path], limit: int,
                      snippet: int) -> list:
    offsets = np.concatenate(([0], np.cumsum(counts)))
    tables: dict[int, dict] = {}
    out = []
    for cluster in result.clusters[:limit]:
        members = []
        for g in cluster[:5]:  # a few members are enough to see why they cluster
            shard = int(np.searchsorted(offsets, g, side="right") - 1)
            if shard not in tables:
                tables[shard] = pq.read_table(stage_files[shard], columns=["id", "source", "domain", "text"]).to_pydict()
            row = int(g - offsets[shard])
            t = tables[shard]
            members.append({"id": t["id"][row], "source": t["source"][row], "domain": t["domain"][row],
                            "kept": bool(g == cluster[0]), "snippet": t["text"][row][:snippet]})
        out.append({"size": int(len(cluster)), "members": members})
    return out


def _table_sum(tables: Sequence[dict], key: str) -> dict:
    out: dict[str, dict] = {}
    for t in tables:
        for name, c in t[key].items():
            cell = out.setdefault(name, {"docs": 0, "bytes": 0})
            cell["docs"] += c["docs"]
            cell["bytes"] += c["bytes"]
    return out


def build_report(*, inputs, cfg: CurateConfig, read_stats: ReadStats, stats: StageStats, dedup: DedupResult,
                 cols: dict, alive_before_dedup: np.ndarray, stage_files: Sequence[Path], counts: Sequence[int],
                 plan: MixPlan,
                 written: list[dict], skipped_shards: int, timing: dict, substring: SubstringResult | None = None) -> dict:
    data = stats.to_dict()
    stages = [_stage_entry(n, data[n]) for n in STAGE_ORDER if n in data]
    kept = alive_before_dedup & ~dedup.exact_duplicate & ~dedup.near_duplicate
    if substring is not None:  # documents the substring cuts emptied are dropped; cols["nbytes"] are after the cuts
        kept &= ~substring.emptied
    out_domain, out_source = _table_sum(written, "by_domain"), _table_sum(written, "by_source")
    out_bytes = sum(c["bytes"] for c in out_domain.values())

    def breakdown(group: str, column: str, output: dict) -> dict:
        rows = {}
        for name, cell in data.get("normalize", {}).get(group, {}).items():
            sel = kept & (cols[column] == name)
            rows[name] = {"docs_in": cell["docs_in"], "bytes_in": cell["bytes_in"],
                          "docs_kept": int(sel.sum()), "bytes_kept": int(cols["nbytes"][sel].sum()),
                          "docs_out": output.get(name, {}).get("docs", 0), "bytes_out": output.get(name, {}).get("bytes", 0)}
        return rows

    domains = breakdown("by_domain", "domain", out_domain)
    total = {k: sum(r[k] for r in domains.values()) for k in
             ("docs_in", "bytes_in", "docs_kept", "bytes_kept", "docs_out", "bytes_out")}
    exact_removed = alive_before_dedup & dedup.exact_duplicate
    near_removed = alive_before_dedup & ~dedup.exact_duplicate & dedup.near_duplicate
    near = cfg.dedup.near_config()
    method = ({"bands": cfg.dedup.minhash.bands, "rows": cfg.dedup.minhash.rows} if cfg.dedup.near == "minhash"
              else {"k": cfg.dedup.simhash.k, "blocks": cfg.dedup.simhash.k + 1})
    seconds = timing["total_s"]
    return {
        "version": 1,
        "inputs": [str(p) for p in inputs],
        "config": "config.toml",
        "read": read_stats.to_dict(),
        "totals": total,
        "domains": domains,
        "sources": breakdown("by_source", "source", out_source),
        "stages": stages,
        "dedup": {
            "substring": substring_section(cfg.dedup.substring, cols, substring),
            "exact": {"enabled": cfg.dedup.exact.enabled, "groups": dedup.exact_groups,
                      "removed_docs": int(exact_removed.sum()), "removed_bytes": int(cols["nbytes"][exact_removed].sum())},
            "near": cfg.dedup.near,
            cfg.dedup.near: {"enabled": near.enabled, "ngram": near.ngram, **method,
                             "clusters": len(dedup.clusters), "removed_docs": int(near_removed.sum()),
                             "removed_bytes": int(cols["nbytes"][near_removed].sum()),
                             "size_histogram": _histogram([len(c) for c in dedup.clusters]),
                             "largest": _cluster_examples(dedup, counts, stage_files, cfg.dedup.cluster_examples,
                                                          cfg.output.snippet_chars)},
        },
        "mix": {"weights": cfg.mixing.weights, "max_repeats": cfg.mixing.max_repeats,
                "target_bytes": plan.target_bytes, "rates": {k: round(v, 4) for k, v in plan.rates.items()},
                "notes": plan.notes, "available_bytes": {d: r["bytes_kept"] for d, r in domains.items()},
                "output": {d: {**c, "share": round(c["bytes"] / out_bytes, 4) if out_bytes else 0.0}
                           for d, c in sorted(out_domain.items())}},
        "audit": {name.removeprefix("audit:"): {d: {"docs": c["docs_in"], "would_remove": c["docs_in"] - c["docs_out"],
                                                     "reasons": c["reasons"]} for d, c in data[name]["by_domain"].items()}
                  for name in data if name.startswith("audit:")},
        "shards": {"format": cfg.output.format, "count": len(written),
                   "written": sum(1 for w in written if not w["skipped"] and w["docs"]),
                   "skipped_existing_parts": sum(1 for w in written if w["skipped"]),
                   "skipped_complete_work_shards": skipped_shards,
                   "files": [w["path"] for w in written if w["docs"]]},
        "timing": {**{k: round(v, 3) for k, v in timing.items()},
                   "docs_per_s": round(total["docs_in"] / seconds, 1) if seconds else None,
                   "mb_per_s": round(total["bytes_in"] / 1e6 / seconds, 2) if seconds else None},
    }


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f}"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def render_markdown(r: dict) -> str:
    t = r["totals"]
    lines = ["# Curation report", "",
             f"{t['docs_in']:,} documents ({_mb(t['bytes_in'])} MB) read; {t['docs_kept']:,} "
             f"({_mb(t['bytes_kept'])} MB) survive filtering and deduplication; {t['docs_out']:,} "
             f"({_mb(t['bytes_out'])} MB) written after mixing, in {r['timing']['total_s']:.1f} s "
             f"({r['timing']['mb_per_s']} MB/s).", "",
             "| domain | docs in | MB in | docs kept | MB kept | docs out | MB out | share out |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for d, c in r["domains"].items():
        share = r["mix"]["output"].get(d, {}).get("share", 0.0)
        lines.append(f"| {d} | {c['docs_in']:,} | {_mb(c['bytes_in'])} | {c['docs_kept']:,} | {_mb(c['bytes_kept'])} "
                     f"| {c['docs_out']:,} | {_mb(c['bytes_out'])} | {100 * share:.1f}% |")
    read = r["read"]
    problems = [(k, read[k], read[f"{k.removesuffix('_files')}_examples"]) for k in PROBLEM_KINDS if read.get(k)]
    if problems:
        lines += ["", "## Input problems (skipped and counted)", ""]
        for kind, n, examples in problems:
            lines.append(f"- {kind.replace('_', ' ')}: {n:,}" + "".join(f"\n  - `{e}`" for e in examples[:5]))
    crawl = read.get("crawl") or {}
    if crawl.get("files"):
        lines += ["", "## Crawl files", "", WarcStats.from_dict(crawl).summary() + ".", ""]
        for label, key in (("records by type", "records_by_type"), ("responses that are not HTML", "non_html_by_type"),
                           ("charset taken from", "charset_sources")):
            if crawl.get(key):
                lines.append(f"- {label}: " + ", ".join(f"{t} {n:,}" for t, n in sorted(crawl[key].items())))
        for kind, where in crawl.get("positions", {}).items():
            lines.append(f"- {kind.replace('_', ' ')}: {crawl[kind]:,}" + "".join(f"\n  - `{e}`" for e in where[:5]))
    lines += ["", "## Stages, per domain", "",
              "Each filter judges only the domains configured for it (`[filters]`); a prose filter never sees code.", "",
              "| stage | domain | docs in | docs out | removed | bytes removed | top reasons | s | docs/s |",
              "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for s in r["stages"]:
        for d, c in s["by_domain"].items():
            reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(c["reasons"].items(), key=lambda kv: -kv[1])[:3])
            lines.append(f"| {s['name']} | {d} | {c['docs_in']:,} | {c['docs_out']:,} | "
                         f"{_pct(c['docs_in'] - c['docs_out'], c['docs_in'])} | "
                         f"{_pct(c['bytes_in'] - c['bytes_out'], c['bytes_in'])} | {reasons} | {s['seconds']:.2f} | "
                         f"{s['docs_per_s'] or '-'} |")
        if s["extra"]:
            lines.append(f"| {s['name']} | (all) | | | | | " + ", ".join(f"{k} {v:,}" for k, v in s["extra"].items())
                         + f" | {s['seconds']:.2f} | |")
    if r["audit"]:
        lines += ["", "## If filters were applied blindly (sample, no effect on the output)", "",
                  "| filter | domain | docs | would remove | top reasons |", "| --- | --- | ---: | ---: | --- |"]
        for name, by_domain in r["audit"].items():
            for d, c in by_domain.items():
                reasons = ", ".join(f"{k} {v}" for k, v in sorted(c["reasons"].items(), key=lambda kv: -kv[1])[:2])
                lines.append(f"| {name} | {d} | {c['docs']} | {_pct(c['would_remove'], c['docs'])} | {reasons} |")
    lines += ["", "## Removed examples", ""]
    for s in r["stages"]:
        for e in s["examples"][:3]:
            snippet = " ".join(e["snippet"].split())[:160]
            lines.append(f"- **{s['name']}** `{e['id']}` ({e['domain']}, {e['reason']}): {snippet}")
    near = r["dedup"].get("near", "minhash")
    ex, mh = r["dedup"]["exact"], r["dedup"][near]
    how = (f"MinHash ({mh['bands']} bands x {mh['rows']} rows" if near == "minhash"
           else f"SimHash (64 bits, at most {mh['k']} apart, {mh['blocks']} blocks")
    lines += ["", "## Deduplication", "",
              f"- exact: {ex['groups']:,} groups, {ex['removed_docs']:,} documents ({_mb(ex['removed_bytes'])} MB) removed",
              f"- {how}, word {mh['ngram']}-grams): {mh['clusters']:,} clusters, "
              f"{mh['removed_docs']:,} documents ({_mb(mh['removed_bytes'])} MB) removed; sizes "
              + ", ".join(f"{k}: {v}" for k, v in mh["size_histogram"].items())]
    for c in mh["largest"]:
        lines.append(f"  - cluster of {c['size']}: " + ", ".join(
            f"`{m['id']}`{' (kept)' if m['kept'] else ''}" for m in c["members"]))
    lines += substring_lines(r["dedup"].get("substring", {}))
    mix = r["mix"]
    lines += ["", "## Mix", "", f"Weights: {mix['weights'] or 'none (everything kept once)'}; "
              f"at most {mix['max_repeats']} copies of a document.", ""]
    lines += [f"- {d}: {c['docs']:,} documents, {_mb(c['bytes'])} MB, {100 * c['share']:.1f}% of output"
              + (f" (rate {mix['rates'][d]})" if d in mix["rates"] else "") for d, c in mix["output"].items()]
    lines += [f"- note: {n}" for n in mix["notes"]]
    sh, tm = r["shards"], r["timing"]
    lines += ["", "## Output and time", "",
              f"{sh['count']} shards ({sh['format']}) in `shards/`; {sh['skipped_existing_parts']} existing parts and "
              f"{sh['skipped_complete_work_shards']} completed work shards reused.", "",
              f"Wall clock: curate shards {tm['curate_shards_s']} s, global dedup and mix {tm['global_s']} s, "
              f"write {tm['write_s']} s, total {tm['total_s']} s ({tm['docs_per_s']} docs/s)."]
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict) -> None:
    atomic_write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", render_markdown(report))
