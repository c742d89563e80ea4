"""`groundup quantize`: int8 / int4 / GPTQ weight-only quantization of a model directory.

    groundup quantize --model out/model --method int8
    groundup quantize --model out/model --method int4 --group-size 64 --out out/model-int4
    groundup quantize --model runs/tiny --method gptq --calibration data/val.jsonl --act-order

The output is a model directory that generate, chat, eval and serve load like any other.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from groundup.arguments import add_loading_arguments, add_model_argument

OVERWRITE_HELP = "replace --out if it exists and is not empty (never the model being read)"


def quantize_arguments(p: argparse.ArgumentParser) -> None:
    from groundup.quant.calibration import DEFAULT_SEQ_LEN, DEFAULT_TOKENS, MIN_TOKENS

    add_model_argument(p, help="a full-precision model directory or a training run directory")
    p.add_argument("--method", required=True, help="int8 (per-channel), int4 (groups, round to nearest) or gptq")
    p.add_argument("--bits", type=int, default=None, help="4 or 8 (gptq; default 4); implied by int8 / int4")
    p.add_argument("--group-size", type=int, default=None, help="4-bit group size: 32, 64 or 128 (default: 128)")
    p.add_argument("--calibration", nargs="+", default=None, metavar="FILES",
                   help="gptq: text records (JSONL, Parquet, text files or directories) to calibrate on "
                        "(default: a slice of the embedded corpus, its three domains interleaved)")
    p.add_argument("--calibration-tokens", type=int, default=DEFAULT_TOKENS,
                   help=f"gptq: use the first N tokens of the calibration text (default: {DEFAULT_TOKENS}; "
                        f"at least {MIN_TOKENS})")
    p.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN,
                   help=f"gptq: calibration sequence length (default: {DEFAULT_SEQ_LEN}, at most the model's context)")
    p.add_argument("--act-order", action="store_true",
                   help="gptq: quantize columns in order of decreasing activation (the stored order is unchanged)")
    p.add_argument("--damp", type=float, default=0.01, help="gptq: Hessian dampening x mean diagonal (default: 0.01)")
    p.add_argument("--include-embeddings", action="store_true",
                   help="also quantize the embedding and the output layer (default: kept in full precision)")
    p.add_argument("--out", type=Path, default=None, help="the model directory to write (default: "
                   "CHECKPOINT-METHOD beside the model directory)")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    add_loading_arguments(p, adapter=False, dtype=False)
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _default_out(model_dir: Path, spec) -> Path:
    """MODEL-TAG beside a model directory; RUN-TAG beside a run for one of its checkpoints."""
    from groundup.layout import STEP_DIR

    tag = (spec.method if spec.method != "gptq" else f"gptq{spec.bits}") + (f"-g{spec.group_size}" if spec.group_size else "")
    base = model_dir.parent.parent if STEP_DIR.match(model_dir.name) else model_dir
    return base.parent / f"{base.name}-{tag}"


def quantize(args: argparse.Namespace) -> int:
    import torch

    from groundup.config import ConfigError
    from groundup.errors import CheckpointError
    from groundup.device import resolve_device
    from groundup.io import atomic_dir
    from groundup.layout import TOKENIZER_DIR, claim_output_dir, find_tokenizer_dir, mark_output_dir, resolve_model_dir
    from groundup.model.model_dir import load_float_model
    from groundup.quant.calibration import calibration_rows
    from groundup.quant.quantized_dir import is_quantized, read_quant_spec, save_quantized_model
    from groundup.quant.quantize import quantize_model
    from groundup.quant.spec import QuantSpec

    # Everything a user can get wrong is checked before the model is read.
    spec = QuantSpec.make(args.method, args.bits, args.group_size, args.act_order, args.include_embeddings)
    if spec.method != "gptq" and args.calibration:
        raise ConfigError(f"--calibration applies to --method gptq only, not {spec.method}", key="calibration")
    device = resolve_device(args.device)
    model_dir = resolve_model_dir(args.model)
    if is_quantized(model_dir):
        existing = read_quant_spec(model_dir, strict=False)
        how = existing.describe() if existing else "a [quantization] table"
        raise ConfigError(f"{model_dir} is already quantized ({how}); quantize the full-precision model it came from",
                          key="model")
    out = claim_output_dir(args.out or _default_out(model_dir, spec), "quantize", overwrite=args.overwrite,
                           sources=[model_dir])
    tok_dir = Path(args.tokenizer) if args.tokenizer else find_tokenizer_dir(model_dir)
    if tok_dir is not None and not tok_dir.is_dir():
        raise CheckpointError(f"--tokenizer {tok_dir}: no such directory")
    if spec.method == "gptq" and tok_dir is None:
        raise CheckpointError(f"{model_dir}: no tokenizer beside the model to encode the calibration text with; "
                              "pass --tokenizer DIR")

    model = load_float_model(model_dir, device)
    rows = None
    if spec.method == "gptq":
        tokenizer = _load_tokenizer(tok_dir)
        seq_len = min(args.seq_len, model.cfg.max_seq_len)
        rows = calibration_rows(args.calibration, tokenizer, args.calibration_tokens, seq_len)
        rows = [torch.tensor(r) for r in rows]
    before = _weight_bytes(model)
    log = (lambda s: print(s, file=sys.stderr)) if args.json else print
    report = quantize_model(model, spec.method, bits=spec.bits, group_size=args.group_size, calibration=rows,
                            act_order=spec.act_order, include_embeddings=spec.include_embeddings, damp=args.damp,
                            progress=log)
    after = _weight_bytes(model)
    with atomic_dir(out) as tmp:
        mark_output_dir(tmp, "quantize")
        save_quantized_model(model, tmp, metadata={"source": str(model_dir)})
        if tok_dir is not None:
            shutil.copytree(tok_dir, tmp / TOKENIZER_DIR)
    summary = {"out": str(out), "source": str(model_dir), "bytes_before": before, "bytes_after": after,
               **report.to_dict()}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    errors = report.errors()
    worst = max(errors, key=errors.get) if errors else None
    kind = "output" if spec.method == "gptq" else "weight"
    print(f"wrote {out}: {report.spec.describe()}, {len(report.layers)} weights quantized in {report.seconds:.1f}s; "
          f"tensors {before / 1e6:.2f}MB -> {after / 1e6:.2f}MB")
    if errors:
        mean = sum(errors.values()) / len(errors)
        print(f"relative {kind} error per layer: mean {mean:.3g}, worst {errors[worst]:.3g} ({worst})")
    if spec.method == "gptq":
        rtn = [r.rtn_output_error for r in report.layers if r.rtn_output_error is not None]
        if rtn:
            print(f"round-to-nearest on the same inputs: mean {sum(rtn) / len(rtn):.3g}")
    if tok_dir is None:
        print("note: no tokenizer found beside the model; generate and chat need --tokenizer DIR", file=sys.stderr)
    return 0


def _load_tokenizer(path: Path):
    try:
        from groundup.tokenizer import load_tokenizer
    except ImportError:  # older trees: groundup's own backend only
        from groundup.tokenizer import Tokenizer

        return Tokenizer.load(path)
    return load_tokenizer(path)


def _weight_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())
