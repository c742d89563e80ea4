"""`groundup model info`: sizes of a preset or config, computed on the meta device."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def info_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a preset name (tiny, ladder-100m, clover-12b, ...) or a TOML file "
                                 "(a [model] table, or model keys at the top level)")
    p.add_argument("overrides", nargs="*", help="model.key=value overrides (the 'model.' prefix is optional)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--seq-len", type=int, default=None, help="context for FLOPs and KV totals (default: max_seq_len)")


def resolve_model_config(spec: str, overrides: list[str]):
    """A ModelConfig from a preset name or a TOML file, with `key=value` overrides applied."""
    from groundup.config import apply_overrides, from_dict, read_toml
    from groundup.model.config import ModelConfig
    from groundup.model.presets import PRESETS

    if spec.endswith(".toml") or Path(spec).is_file():
        data = read_toml(spec)
        if isinstance(data.get("model"), dict):
            data = data["model"]
    elif spec in PRESETS:
        data = {"preset": spec}
    else:
        data = {"preset": spec}  # ModelConfig names the nearest preset in its error
    wrapped = {"model": data}
    apply_overrides(wrapped, [o if o.startswith("model.") else f"model.{o}" for o in overrides])
    return from_dict(ModelConfig, wrapped["model"], prefix="model.")


def _human(n: float, unit: str = "") -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B" if not unit else "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}{unit}"
    return f"{n:.0f}{unit}"


def info(args: argparse.Namespace) -> None:
    import dataclasses

    from groundup.model.sizing import flops_per_token, model_summary

    cfg = resolve_model_config(args.model, args.overrides)
    summary = model_summary(cfg)
    if args.seq_len:
        summary["flops_per_token"] = flops_per_token(cfg, args.seq_len)
        summary["kv_bytes_full_context"] = summary["kv_bytes_per_token"] * args.seq_len
        summary["context"] = args.seq_len
    if args.json:
        print(json.dumps({**summary, "config": dataclasses.asdict(cfg)}, indent=2))
        return
    kv_note = ""
    if summary["kv_bytes_per_token_mha_equivalent"] != summary["kv_bytes_per_token"]:
        ratio = summary["kv_bytes_per_token_mha_equivalent"] / summary["kv_bytes_per_token"]
        kv_note = f"  ({ratio:.1f}x less than multi-head attention: {_human(summary['kv_bytes_per_token_mha_equivalent'], 'B')})"
    attn = "MLA" if cfg.attention == "mla" else ("MHA" if cfg.kv_heads == cfg.n_heads else
                                                   "MQA" if cfg.kv_heads == 1 else "GQA")
    ffn = f"{cfg.mlp} {cfg.ffn_dim}" + (f", MoE {cfg.n_experts} experts top-{cfg.moe_top_k}" if cfg.n_experts else "")
    rows = [
        ("model", f"{cfg.name}: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads ({attn}), {ffn}"),
        ("parameters", f"{_human(summary['params_total'])} total, {_human(summary['params_active'])} active, "
                       f"{_human(summary['params_embedding'])} embedding"),
        ("FLOPs per token", f"{_human(summary['flops_per_token'])} (training, at context {summary['context']})"),
        ("weights", f"{_human(summary['weights_bytes_bf16'], 'B')} bf16, {_human(summary['weights_bytes_fp32'], 'B')} fp32"),
        ("KV cache", f"{_human(summary['kv_bytes_per_token'], 'B')} per token (bf16){kv_note}"),
        ("KV at full context", f"{_human(summary['kv_bytes_full_context'], 'B')} per sequence of {summary['context']}"),
    ]
    for key, value in rows:
        print(f"{key:<20} {value}")
