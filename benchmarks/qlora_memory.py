"""Peak memory of LoRA fine-tuning over an fp32 base against full fine-tuning and int8 and int4 (QLoRA) bases.

    .venv/bin/python benchmarks/qlora_memory.py [--batch 2] [--seq-len 128] [--rank 16] [--steps 2]

The model is the 100M ladder shape with vocab 8192 (ladder-100m: d_model 640, 16 layers, tied; random
weights). Each base is written as a model directory first (fp32; `groundup quantize` int8 and int4-g128).
Then, inside groundup.plan.measure.track_peak (c10's process-wide CPU allocation counter, the way
`groundup plan` measures), each is loaded from its directory, gets LoRA adapters (rank --rank on attention
and MLP, as `groundup sft lora.rank=...` applies them), an AdamW over the adapters, and takes --steps
training steps (forward, backward, optimizer step) on fixed random tokens. Reported per base: the peak
of live tensor bytes, the bytes live after loading (the base's weights), the step's peak above that,
the adapter's size and the losses. "full fine-tuning (fp32)" trains every parameter of the same fp32
base with the same AdamW (gradients and two moments for all of them), what LoRA saves. One more row, "int4, float copy kept for backward", is the same
int4 base trained through a plain dequantize-then-F.linear (what autograd does without QuantMatmul:
every layer's float weight saved for the backward pass) to show what the custom backward saves.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from groundup.config import from_dict  # noqa: E402
from groundup.model import ModelConfig, Transformer  # noqa: E402
from groundup.model.model_dir import save_model
from groundup.quant.load import load_model  # noqa: E402
from groundup.model.lora import LoraConfig, adapter_state, apply_lora  # noqa: E402
from groundup.plan.measure import span, track_peak  # noqa: E402
from groundup.quant import QuantLinear, quantize_model, save_quantized_model  # noqa: E402

CONFIG = {"preset": "ladder-100m", "vocab_size": 8192, "max_seq_len": 512}


def train(model_dir: Path, tokens: torch.Tensor, rank: int, steps: int, naive: bool = False) -> tuple[dict, list]:
    losses = []
    original = QuantLinear.forward
    if naive:  # autograd through dequantize-then-matmul: the float weight is saved for backward
        QuantLinear.forward = lambda self, x: F.linear(x, self.dequantize(), self.bias)
    try:
        with track_peak() as peak:
            with span("load"):
                model = load_model(model_dir).train()
            with span("steps"):
                torch.manual_seed(0)
                if rank:
                    apply_lora(model, LoraConfig(rank=rank, alpha=2 * rank))
                opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
                for _ in range(steps):
                    loss = model(tokens[:, :-1], tokens[:, 1:]).loss
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    losses.append(round(float(loss), 5))
            adapter = sum(t.numel() * t.element_size() for t in adapter_state(model).values()) if rank else 0
            del model, opt, loss
    finally:
        QuantLinear.forward = original
    weights = peak.starts.get("steps", 0.0)
    return {"peak_mb": round(peak.peak / 1e6, 1), "weights_mb": round(weights / 1e6, 1),
            "step_peak_above_weights_mb": round((peak.marks.get("steps", peak.peak) - weights) / 1e6, 1),
            "adapter_mb": round(adapter / 1e6, 2), "method": peak.method}, losses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = from_dict(ModelConfig, dict(CONFIG))
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1), generator=torch.Generator().manual_seed(1))
    rows, t0 = {}, time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        root = Path(root)
        torch.manual_seed(0)
        base = Transformer(cfg).eval()
        save_model(base, root / "fp32")
        for method, options in (("int8", {}), ("int4-g128", {"group_size": 128})):
            m = load_model(root / "fp32")
            quantize_model(m, method.split("-")[0], **options)
            save_quantized_model(m, root / method)
        del base, m
        for name, path, naive in (("fp32", "fp32", False), ("full fine-tuning (fp32)", "fp32", False),
                                  ("int8", "int8", False), ("int4-g128", "int4-g128", False),
                                  ("int4-g128, float copy kept for backward", "int4-g128", True)):
            print(f"{name} ...", file=sys.stderr, flush=True)
            rank = 0 if name.startswith("full") else args.rank
            rows[name], losses = train(root / path, tokens, rank, args.steps, naive)
            rows[name]["losses"] = losses
            rows[name]["files_mb"] = round(sum(f.stat().st_size for f in (root / path).iterdir()) / 1e6, 1)
    fp32 = rows["fp32"]["peak_mb"]
    for r in rows.values():
        r["peak_vs_fp32"] = round(r["peak_mb"] / fp32, 3)
    print(json.dumps({
        "benchmark": "qlora_memory", "command": " ".join(["python", *sys.argv]),
        "model": "ladder-100m shape, vocab 8192 (d_model 640, 16 layers, 10/5 heads, FFN 1792, tied), random weights",
        "params_m": round(cfg.approx_params() / 1e6, 1),
        "lora": {"rank": args.rank, "alpha": 2 * args.rank, "targets": ["attention", "mlp"]},
        "batch": args.batch, "seq_len": args.seq_len, "steps": args.steps,
        "measured": "peak live tensor bytes through c10's CPU allocation counter (groundup/plan/measure.py), "
                    "from loading the base to the last optimizer step",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "threads": args.threads, "torch": torch.__version__},
        "note": "memory does not depend on the thread count; one thread (the default) because the machine is shared",
        "bases": rows, "seconds": round(time.perf_counter() - t0)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
