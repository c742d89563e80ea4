"""The readable table `groundup plan` prints (`--json` prints Plan.to_dict() instead)."""

from __future__ import annotations

from groundup.plan.estimate import Plan
from groundup.plan.memory import PARTS

PART_LABELS = {"weights": "weights", "master_weights": "fp32 master weights", "gradients": "gradients",
               "optimizer": "optimizer state", "activations": "activations", "loss": "loss (fused, chunked)",
               "temporaries": "temporary buffers"}


def human(n: float, unit: str = "") -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B" if not unit else "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}{unit}"
    return f"{n:.0f}{unit}"


def gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def format_plan(p: Plan) -> str:
    g, pr = p.gpu, p.params
    active = f", {human(pr.active)} active per token" if pr.active != pr.total else ""
    lines = [
        f"{'model':<13} {p.model}: {human(pr.total)} parameters ({human(pr.embedding)} embedding, "
        f"{human(pr.non_embedding)} non-embedding){active}",
        f"{'FLOPs/token':<13} {human(pr.flops_per_token)} at sequence length {p.seq_len} (training: 6N + attention)",
        f"{'GPUs':<13} {p.gpus} x {g.label} ({gb(g.memory_bytes)} GB; {gb(p.usable_bytes)} GB usable with "
        f"{p.headroom:.0%} headroom), {p.gpus_per_node} per node",
        f"{'run':<13} {p.precision}, {p.optimizer}, micro-batch {p.micro_batch} x {p.seq_len}, "
        f"{p.grad_accum} accumulation step{'s' if p.grad_accum != 1 else ''}, activation checkpointing "
        f"{'on' if p.checkpointing else 'off'}",
        f"{'loss':<13} fused output layer + cross-entropy: {gb(p.logits_chunk_bytes)} GB of fp32 logits per chunk "
        f"(full logits and their gradient would be {gb(p.full_logits_bytes)} GB)",
        "",
    ]
    rows = p.strategies
    width = max(16, *(len(s.label) + 2 for s in rows))
    head = f"{'memory per GPU (GB)':<26}" + "".join(f"{s.label:>{width}}" for s in rows)
    lines.append(head)

    def row(label: str, values: list[str]) -> None:
        lines.append(f"{label:<26}" + "".join(f"{v:>{width}}" for v in values))

    row("layout", [f"shard {s.shard}" + (f" x TP {s.tp}" if s.tp > 1 else "") +
                   (f" x {s.replicas} replicas" if s.replicas > 1 else "") for s in rows])
    for part in PARTS:
        row(f"  {PART_LABELS[part]}", [gb(s.parts[part]) for s in rows])
    row("peak", [gb(s.peak_bytes) for s in rows])
    row("  at", [_short_phase(s.peak_phase) for s in rows])
    row("  with checkpointing", [gb(s.peak_bytes_checkpointed) for s in rows])
    row("  without checkpointing", [gb(s.peak_bytes_full) for s in rows])
    row("  activations, ckpt / none", [f"{gb(s.activations_checkpointed)} / {gb(s.activations_full)}" for s in rows])
    row("fits", ["yes" if s.fits else "no" for s in rows])
    row("largest micro-batch", [str(s.max_micro_batch) for s in rows])
    row("tokens per step", [human(s.tokens_per_step) for s in rows])
    row("time per step", [duration(s.step_time_s) for s in rows])
    lines.append("")
    peak_name = "bf16" if p.precision != "fp32" else "fp32"
    peak = g.peak(p.precision != "fp32")
    hfu = f" (HFU {p.hfu:.2f} with the recomputed forward)" if p.checkpointing else ""
    lines.append(f"{'throughput':<13} {p.tokens_per_sec_per_gpu:,.0f} tokens/s per GPU at MFU {p.mfu:.2f} of "
                 f"{peak / 1e12:.1f} TFLOP/s dense {peak_name}{hfu}")
    lines.append(f"{'total':<13} {human(p.tokens)} tokens in {duration(p.total_time_s)} on {p.gpus} GPUs: "
                 f"{p.gpu_hours:,.0f} GPU hours")
    for s in rows:
        if s.accumulation:
            modes = ", ".join(f"{k} {gb(v)} GB" for k, v in s.accumulation.items())
            lines.append(f"{s.label}: peak by how gradients accumulate: {modes}")
    for s in rows:
        for note in s.notes:
            lines.append(f"note: {s.label}: {note}")
    for note in p.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _short_phase(phase: str) -> str:
    phase = phase.replace(" (micro-batch: ", " (").replace("backward of block", "bwd block")
    phase = phase.replace("forward of block", "fwd block")
    return phase
