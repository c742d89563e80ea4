"""Parameter counts per block and outside the blocks, from the real module on the meta device.

The totals are groundup.model.sizing's; this splits them the way the memory plan needs: per
FSDP unit (each block, then the root: embedding, final norm, output layer), and per block into
what tensor parallelism divides (the attention and MLP matrices) and what it replicates (norms,
the MoE router, MLA's down-projections that every head shares).
"""

from __future__ import annotations

from dataclasses import dataclass

from groundup.model.config import ModelConfig
from groundup.model.sizing import build_meta, param_counts

# Parameters tensor parallelism does not split: norms and biases of norms, the router, and MLA's
# shared latent projections (q_down, kv_down and their norms).
_REPLICATED = ("norm", "router", "q_down", "kv_down")


@dataclass(frozen=True)
class ParamSplit:
    blocks: tuple[dict[str, int], ...]  # per block: total, matmul, replicated (norms, router, ...), experts
    embed: int
    lm_head: int  # 0 when tied
    final_norm: int
    counts: dict[str, int]  # groundup.model.sizing.param_counts
    largest: int  # the largest single parameter (an optimizer's per-tensor temporaries)

    @property
    def total(self) -> int:
        return self.counts["params_total"]

    @property
    def root(self) -> int:
        """What the outermost FSDP unit holds: everything outside the blocks."""
        return self.embed + self.lm_head + self.final_norm

    def tp_share(self, tp: int) -> float:
        """Parameters one tensor-parallel rank holds (vocabulary-parallel embedding and output)."""
        blocks = sum(b["total"] - b["replicated"] + b["replicated"] * tp for b in self.blocks) / tp
        return blocks + (self.embed + self.lm_head) / tp + self.final_norm

    def muon_matrices(self) -> int:
        """Parameters Muon updates (2-D hidden matrices); AdamW takes the rest."""
        return sum(b["matrices_2d"] for b in self.blocks)


_cache: dict[str, ParamSplit] = {}


def param_split(cfg: ModelConfig) -> ParamSplit:
    key = repr(cfg)
    if key not in _cache:
        model = build_meta(cfg)
        blocks = []
        for block in model.blocks:
            entry = {"total": 0, "matmul": 0, "replicated": 0, "matrices_2d": 0, "experts": 0}
            for name, p in block.named_parameters():
                n = p.numel()
                entry["total"] += n
                if p.dim() >= 2:
                    entry["matmul"] += n
                if p.dim() == 2:
                    entry["matrices_2d"] += n
                if "experts_" in name:  # the routed experts' stacks (expert parallelism splits them)
                    entry["experts"] += n
                if any(part in name for part in _REPLICATED):
                    entry["replicated"] += n
            blocks.append(entry)
        final_norm = sum(p.numel() for p in model.norm.parameters()) if model.norm is not None else 0
        lm_head = model.lm_head.weight.numel() if model.lm_head is not None else 0
        largest = max(p.numel() for p in model.parameters())
        _cache[key] = ParamSplit(tuple(blocks), model.embed.weight.numel(), lm_head, final_norm,
                                 param_counts(cfg, model), largest)
    return _cache[key]


def block_params(cfg: ModelConfig, layer: int) -> dict[str, int]:
    return param_split(cfg).blocks[layer]
