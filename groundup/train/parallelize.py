"""Tensor parallelism for groundup's transformer on DTensor, and the 2-D (dp, tp) mesh it shares with FSDP2.

    mesh = init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))
    tensor_parallel(model, mesh["tp"], sequence_parallel=False)   # then fully_shard(..., mesh=mesh["dp"])

Megatron's layout: in every block the q, k, v and the gate/up projections are split by output
features over the `tp` processes (ColwiseParallel), the attention output and down projections by
input features (RowwiseParallel, one all-reduce each), so each process holds n_heads / tp query
heads with their n_kv_heads / tp key/value heads and d_ff / tp hidden units. Embeddings, norms and
the output layer stay whole on every tp process (FSDP shards them over dp): the loss is a fused,
vocabulary-chunked kernel (model/loss.py) that calls no module a plan could shard.

Fused projections. `qkv_proj` holds [q; k; v] and `gate_up_proj` [gate; up] stacked by rows;
sharding that stack by rows would hand process 0 all of q and process 1 the k and v. Under tensor
parallelism each fused projection becomes a `SplitLinear` of separate q/k/v (gate/up) Linear parts,
each split over tp, whose outputs are concatenated locally: [q_r; k_r; v_r] is exactly what the
unchanged `Attention.forward` splits once it is told its local head counts. The parameter names
change (`qkv_proj.q.weight`), so `fuse_state` / `split_state` convert state dicts, and every
checkpoint a reader sees holds the fused, canonical names.

Sequence parallelism (`distributed.sequence_parallel`): between blocks' sub-layers the residual
stream is split by sequence over tp, the norms run on their shard, and the row-parallel output
projections reduce-scatter instead of all-reducing; activations per process drop by tp. The last
block gathers the sequence back for the final norm and the loss.

Not sharded here: multi-head latent attention and mixture-of-experts layers (those split by expert
instead: distributed.ep, expert_parallel.py), and QK-norm (its per-head weights would receive partial
gradients on each tp process).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from groundup.errors import ConfigError

# The fused projections and the parts they are split into, in row order.
FUSED = {"qkv_proj": ("q", "k", "v"), "gate_up_proj": ("gate", "up")}


class SplitLinear(nn.Module):
    """A fused projection as separate Linear parts: forward concatenates the parts' (local) outputs."""

    def __init__(self, fused: nn.Linear, names: tuple[str, ...], sizes: list[int]):
        super().__init__()
        self.names, self.sizes = names, list(sizes)
        start = 0
        for name, size in zip(names, sizes):
            part = nn.Linear(fused.in_features, size, bias=fused.bias is not None, device=fused.weight.device,
                             dtype=fused.weight.dtype)
            with torch.no_grad():
                part.weight.copy_(fused.weight[start : start + size])
                if fused.bias is not None:
                    part.bias.copy_(fused.bias[start : start + size])
            for p in part.parameters():
                p.requires_grad_(fused.weight.requires_grad)
            setattr(self, name, part)
            start += size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([getattr(self, n)(x) for n in self.names], dim=-1)


def check_tp(model_cfg, tp: int, seq_len: int | None = None, sequence_parallel: bool = False) -> None:
    """Refuse, naming the key, what this tensor-parallel layout cannot shard."""
    if tp == 1:
        return
    if model_cfg.attention == "mla":
        raise ConfigError("distributed.tp > 1 with model.attention = 'mla': multi-head latent attention is not "
                          "tensor-parallel here; use FSDP alone (distributed.tp = 1)", key="distributed.tp")
    if model_cfg.n_experts:
        raise ConfigError("distributed.tp > 1 with model.n_experts > 0: mixture-of-experts layers are not "
                          "tensor-parallel here; split their experts instead (distributed.tp = 1, distributed.ep)",
                          key="distributed.tp")
    if model_cfg.qk_norm:
        raise ConfigError("distributed.tp > 1 with model.qk_norm = true is not supported (the per-head norm "
                          "weights would get partial gradients on each tp process)", key="distributed.tp")
    heads, kv = model_cfg.n_heads, model_cfg.kv_heads
    if heads % tp or kv % tp:
        raise ConfigError(f"distributed.tp = {tp} must divide model.n_heads ({heads}) and the key/value heads "
                          f"({kv}): each tp process holds whole heads", key="distributed.tp")
    if model_cfg.ffn_dim % tp:
        raise ConfigError(f"distributed.tp = {tp} must divide the feed-forward width ({model_cfg.ffn_dim})",
                          key="distributed.tp")
    if sequence_parallel and seq_len is not None and seq_len % tp:
        raise ConfigError(f"distributed.sequence_parallel with train.seq_len = {seq_len}: the sequence must "
                          f"split evenly over distributed.tp = {tp}", key="distributed.sequence_parallel")


def split_fused(model: nn.Module) -> None:
    """Replace every fused projection by a SplitLinear of its parts (same values, new parameter names)."""
    for block in _blocks(model):
        attn, mlp = block.attn, block.mlp
        H, K, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
        attn.qkv_proj = SplitLinear(attn.qkv_proj, FUSED["qkv_proj"], [H * D, K * D, K * D])
        if getattr(mlp, "gated", False):
            half = mlp.gate_up_proj.out_features // 2
            mlp.gate_up_proj = SplitLinear(mlp.gate_up_proj, FUSED["gate_up_proj"], [half, half])


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks in order: a Transformer's ModuleList, or a pipeline stage's ModuleDict keyed by layer index."""
    return list(model.blocks.values() if isinstance(model.blocks, nn.ModuleDict) else model.blocks)


def tensor_parallel(model: nn.Module, tp_mesh, sequence_parallel: bool = False) -> None:
    """Shard `model`'s blocks over `tp_mesh` in place (call before fully_shard over the dp mesh). `model`: a
    Transformer, or a pipeline stage (its own blocks: with sequence parallelism its first block splits the
    sequence and its last gathers it back)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                                   RowwiseParallel, SequenceParallel, parallelize_module)

    tp = tp_mesh.size()
    check_tp(model.cfg, tp)  # the model given (post-training loads its base), not only the config's
    split_fused(model)
    seq = Shard(1)
    # Without sequence parallelism the residual stream is whole on every tp process; with it, split by
    # sequence, and the row-parallel projections reduce-scatter into that split.
    row = RowwiseParallel(output_layouts=seq) if sequence_parallel else RowwiseParallel()
    blocks = _blocks(model)
    for i, block in enumerate(blocks):
        attn, mlp = block.attn, block.mlp
        plan = {"attn.o_proj": row, "mlp.down_proj": row}
        for name in FUSED["qkv_proj"]:
            plan[f"attn.qkv_proj.{name}"] = ColwiseParallel()
        if getattr(mlp, "gated", False):
            for name in FUSED["gate_up_proj"]:
                plan[f"mlp.gate_up_proj.{name}"] = ColwiseParallel()
        else:
            plan["mlp.up_proj"] = ColwiseParallel()
        if sequence_parallel:
            norms = ["attn_norm", "mlp_norm"] + (["attn_post_norm", "mlp_post_norm"]
                                                 if block.placement == "sandwich" else [])
            for norm in norms:
                plan[norm] = SequenceParallel(use_local_output=True)  # the residual stream stays plain tensors
            # One all-gather of the normalised shard per sub-layer, shared by all its column-parallel parts.
            plan["attn"] = PrepareModuleInput(input_layouts=(seq, None, None, None, None),
                                              desired_input_layouts=(Replicate(), None, None, None, None))
            plan["mlp"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
        parallelize_module(block, tp_mesh, plan)
        attn.n_heads, attn.n_kv_heads = attn.n_heads // tp, attn.n_kv_heads // tp  # local heads
        if sequence_parallel and i == 0:  # the whole embedded sequence in, this process's shard onward
            parallelize_module(block, tp_mesh, PrepareModuleInput(
                input_layouts=(Replicate(), None, None, None, None),
                desired_input_layouts=(seq, None, None, None, None), use_local_output=True))
        if sequence_parallel and i == len(blocks) - 1:  # the whole sequence for the final norm and loss
            # The gathered output is a view (DTensor.to_local), which FSDP warns about in case it is then
            # modified in place; Transformer.forward only reads it (norm, loss).
            warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
            parallelize_module(block, tp_mesh, PrepareModuleOutput(
                output_layouts=(seq, None), desired_output_layouts=(Replicate(), None), use_local_output=True))
    model.tp_degree = tp


# ----------------------------------------------------------------------------- state dict names


def split_names(model: nn.Module) -> dict[str, tuple[tuple[str, ...], list[int]]]:
    """Fused projection name -> (part names, part row counts) for each SplitLinear in `model` (none: {}); a
    pipelined model's `split_layout` names every stage's (pipeline.shard_stages)."""
    whole = getattr(model, "split_layout", None)
    if whole:
        return whole
    return {name: (m.names, m.sizes) for name, m in model.named_modules() if isinstance(m, SplitLinear)}


def fuse_state(state: dict, splits: dict) -> dict:
    """A full state dict with split parts (`qkv_proj.q.weight`, ...) under the fused names, rows concatenated.

    Works on model state dicts and on optimizer `state` dicts alike (values: tensors, or dicts of
    them keyed by optimizer slot; a slot that is not per-row, like Adam's step count, is taken once).
    """
    if not splits:
        return state
    out, done = {}, set()
    for key, value in state.items():
        prefix, _, leaf = key.rpartition(".")
        owner, _, part = prefix.rpartition(".")
        if owner in splits and part in splits[owner][0]:
            fused = f"{owner}.{leaf}"
            if fused in done:
                continue
            done.add(fused)
            names, sizes = splits[owner]
            pieces = [state[f"{owner}.{n}.{leaf}"] for n in names]
            out[fused] = _cat(pieces, sum(sizes))
        else:
            out[key] = value
    return out


def _cat(pieces, rows: int):
    if isinstance(pieces[0], dict):
        return {k: _cat([p[k] for p in pieces], rows) for k in pieces[0]}
    if isinstance(pieces[0], torch.Tensor) and pieces[0].dim() >= 1 and sum(p.shape[0] for p in pieces) == rows:
        return torch.cat(pieces, dim=0)
    return pieces[0]  # a per-parameter scalar (a step count): the same for every part


def split_state(state: dict, splits: dict) -> dict:
    """The inverse of `fuse_state`: fused rows handed to the SplitLinear parts."""
    if not splits:
        return state
    out = {}
    for key, value in state.items():
        owner, _, leaf = key.rpartition(".")
        if owner in splits:
            names, sizes = splits[owner]
            for name, piece in zip(names, _split(value, sizes)):
                out[f"{owner}.{name}.{leaf}"] = piece
        else:
            out[key] = value
    return out


def _split(value, sizes):
    if isinstance(value, dict):
        per = {k: _split(v, sizes) for k, v in value.items()}
        return [{k: per[k][i] for k in per} for i in range(len(sizes))]
    if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == sum(sizes):
        return list(value.split(sizes, dim=0))
    # A per-parameter scalar (Adam's step count): a copy for each part, which the optimizer increments in place.
    return [value.clone() if isinstance(value, torch.Tensor) else value for _ in sizes]


def fuse_param_groups(groups: list[dict], splits: dict) -> list[dict]:
    """Optimizer param_groups (parameter names) with each split projection's parts named once, fused."""
    return [{**g, "params": _rename(g["params"], splits, fuse=True)} for g in groups]


def split_param_groups(groups: list[dict], splits: dict) -> list[dict]:
    return [{**g, "params": _rename(g["params"], splits, fuse=False)} for g in groups]


def _rename(names: list[str], splits: dict, fuse: bool) -> list[str]:
    out: list[str] = []
    for key in names:
        if fuse:
            prefix, _, leaf = key.rpartition(".")
            owner, _, part = prefix.rpartition(".")
            if owner in splits and part in splits[owner][0]:
                key = f"{owner}.{leaf}"
                if key in out:
                    continue
            out.append(key)
        else:
            owner, _, leaf = key.rpartition(".")
            out += [f"{owner}.{n}.{leaf}" for n in splits[owner][0]] if owner in splits else [key]
    return out
