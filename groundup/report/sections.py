"""The report card's sections: each turns one stage's output file into Markdown lines."""

from __future__ import annotations

from pathlib import Path
from groundup.model.model_dir import load_model_config
from groundup.model.sizing import model_summary


def markdown_table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out + [""]


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def _num(n: float) -> str:
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return f"{n:,.0f}"


def stages_section(stages: dict) -> list[str]:
    rows = [[v.get("title", k), f"{v['seconds']:.1f}"] for k, v in stages.items() if "seconds" in v]
    total = sum(v["seconds"] for v in stages.values() if "seconds" in v)
    return ["## Time per stage", ""] + markdown_table(["stage", "seconds"], rows + [["**total**", f"**{total:.1f}**"]])


def curation_section(report: dict) -> list[str]:
    """Documents and bytes per domain and source, each filter's effect per domain, dedup and mix.

    Reads the `report.json` of `groundup data curate` (see groundup/data/curation_report.py for its keys).
    """
    out = ["## Curation", ""]
    totals = report.get("totals") or {}
    if totals:
        out += [f"{totals.get('docs_in', 0):,} documents ({_mb(totals.get('bytes_in', 0))}) in, "
                f"{totals.get('docs_kept', 0):,} kept by the filters and deduplication, "
                f"{totals.get('docs_out', 0):,} ({_mb(totals.get('bytes_out', 0))}) written after mixing.", ""]
    for title, key in (("Per domain", "domains"), ("Per source", "sources")):
        table = report.get(key) or {}
        if table:
            out += [f"### {title}", ""] + markdown_table(
                [key[:-1], "docs in", "bytes in", "docs kept", "docs out", "bytes out"],
                [[name, f"{v.get('docs_in', 0):,}", _mb(v.get("bytes_in", 0)), f"{v.get('docs_kept', 0):,}",
                  f"{v.get('docs_out', 0):,}", _mb(v.get("bytes_out", 0))] for name, v in table.items()])
    rows = []
    for stage in report.get("stages") or []:
        for domain, v in (stage.get("by_domain") or {}).items():
            removed = v.get("docs_in", 0) - v.get("docs_out", 0)
            if "docs_in" not in v:
                continue
            reasons = ", ".join(f"{k} {n:,}" for k, n in sorted((v.get("reasons") or {}).items(), key=lambda kv: -kv[1])[:3])
            rows.append([stage["name"], domain, f"{v['docs_in']:,}", f"{removed:,}",
                         _mb(v.get("bytes_in", 0) - v.get("bytes_out", 0)), reasons or "-"])
    if rows:
        out += ["### Per filter and domain", ""] + markdown_table(
            ["stage", "domain", "docs in", "docs removed", "bytes removed", "top reasons"], rows)
    dedup = report.get("dedup") or {}
    near = dedup.get("near", "minhash")  # the near-duplicate method that ran: minhash or simhash
    exact, minhash = dedup.get("exact") or {}, dedup.get(near) or {}
    if exact or minhash:
        how = (f"MinHash ({minhash.get('bands', '?')} bands x {minhash.get('rows', '?')} rows)" if near == "minhash"
               else f"SimHash (at most {minhash.get('k', '?')} bits apart)")
        line = (f"Deduplication: exact removed {exact.get('removed_docs', 0):,} documents in "
                f"{exact.get('groups', 0):,} groups; {how} removed {minhash.get('removed_docs', 0):,} in "
                f"{minhash.get('clusters', 0):,} clusters.")
        out += [line, ""]
        for cluster in (minhash.get("largest") or [])[:3]:
            ids = ", ".join(f"`{m['id']}`" + (" (kept)" if m.get("kept") else "") for m in cluster["members"][:4])
            out.append(f"- cluster of {cluster['size']}: {ids}")
        out.append("")
    mix = report.get("mix") or {}
    if mix.get("output"):
        weights = mix.get("weights") or {}
        out += ["### Mix", ""] + markdown_table(
            ["domain", "target share", "achieved share", "documents", "bytes"],
            [[d, f"{100 * weights[d]:.1f}%" if d in weights else "-", f"{100 * v['share']:.1f}%", f"{v['docs']:,}",
              _mb(v["bytes"])] for d, v in mix["output"].items()])
    return out


def tokenizer_section(meta: dict | None, shards: dict | None) -> list[str]:
    out = ["## Tokenizer and token shards", ""]
    if meta:
        trained = meta.get("trained") or {}
        out.append(f"Byte-level BPE, vocabulary {meta.get('vocab_size', 0):,}, hash `{meta.get('hash', '?')}`"
                   + (f", trained on {_mb(trained['bytes'])} in {trained.get('total_seconds', 0):.1f} s."
                      if trained.get("bytes") else "."))
        out.append("")
        stats = meta.get("heldout_stats")
        if stats:
            rows = [[d, f"{e['documents']:,}", f"{e['bytes_per_token']:.3f}" if e.get("bytes_per_token") else "-"]
                    for d, e in [*stats["domains"].items(), ("all", stats["total"])]]
            out += ["Bytes per token on held-out documents:", ""] + markdown_table(["domain", "documents", "bytes/token"], rows)
            out.append(f"Vocabulary used on held-out text: {100 * stats['vocab_used_share']:.1f}%. Longest tokens: "
                       + ", ".join(f"`{t['text']!r}`" for t in stats.get("longest_tokens", [])[:6]) + ".")
            out.append("")
    if shards:
        rows = []
        for split, s in (shards.get("splits") or {}).items():
            for domain, d in (s.get("domains") or {}).items():
                rows.append([split, domain, f"{d['documents']:,}", f"{d['tokens']:,}", _mb(d["bytes"])])
        out += ["Token shards:", ""] + markdown_table(["split", "domain", "documents", "tokens", "bytes"], rows)
    return out


def model_section(model_dir: Path) -> list[str]:
    cfg = load_model_config(model_dir)
    s = model_summary(cfg)
    attn = "MLA" if cfg.attention == "mla" else f"{cfg.n_heads} heads / {cfg.kv_heads} KV heads"
    return ["## Model", "",
            f"`{cfg.name}`: {cfg.n_layers} layers, d_model {cfg.d_model}, {attn}, {cfg.mlp} FFN {cfg.ffn_dim}, "
            f"context {cfg.max_seq_len}, vocabulary {cfg.vocab_size:,}"
            + (", tied embeddings" if cfg.tie_embeddings else "") + ".", "",
            f"{_num(s['params_total'])} parameters ({_num(s['params_total'] - s['params_embedding'])} "
            f"non-embedding), {_num(s['flops_per_token'])} training FLOPs per token, "
            f"{s['weights_bytes_bf16'] / 1e6:.1f} MB of bf16 weights, "
            f"{s['kv_bytes_per_token']:,.0f} KV-cache bytes per token.", ""]


def training_section(train: list[dict], evals: list[dict], events: list[dict], plots: dict[str, Path],
                     summary: dict | None) -> list[str]:
    out = ["## Training", ""]
    if train:
        last = train[-1]
        speeds = [r["tokens_per_sec"] for r in train[1:] if r.get("tokens_per_sec")]
        speed = sorted(speeds)[len(speeds) // 2] if speeds else None
        out.append(f"{last.get('step', len(train)):,} steps, {last.get('tokens', 0):,} tokens; loss "
                   f"{train[0]['loss']:.3f} at the first logged step, {last['loss']:.3f} at the last"
                   + (f"; median {speed:,.0f} tokens/s" if speed else "")
                   + (f", MFU {last['mfu']:.2f}" if last.get("mfu") is not None else "") + ".")
        out.append("")
    if evals:
        rows = []
        for e in evals:
            domains = ", ".join(f"{k.split('/', 1)[1]} {v:.3f}" for k, v in e.items() if k.startswith("val_bpb/"))
            rows.append([f"{e.get('step', '?'):,}", f"{e.get('tokens', 0):,}", f"{e['val_loss']:.4f}",
                         f"{e['val_bpb']:.4f}" if e.get("val_bpb") is not None else "-", domains or "-"])
        out += ["Validation during training:", ""] + markdown_table(["step", "tokens", "val loss", "val bpb",
                                                             "bpb by domain"], rows)
    if events:
        counts: dict[str, int] = {}
        for e in events:
            counts[e["event"]] = counts.get(e["event"], 0) + 1
        out += ["Events: " + ", ".join(f"{k} x{v}" for k, v in counts.items()) + ".", ""]
    for name, path in plots.items():
        out += [f"![{name}]({path.as_posix()})", ""]
    return out


def samples_section(samples: dict) -> list[str]:
    out = ["## Samples", ""]
    settings = samples.get("settings")
    if settings:
        out += [", ".join(f"{k} {v}" for k, v in settings.items()) + ".", ""]
    for item in samples.get("samples", []):
        out += [f"**{item['domain']}** prompt `{item['prompt'][:80]!r}`:", "", "```",
                (item["prompt"] + item["completion"]).strip("\n"), "```", ""]
    return out
