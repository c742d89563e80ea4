"""Expert parallelism for the MoE layers: each of `distributed.ep` processes holds n_experts / ep experts.

    torchrun --nproc-per-node 4 -m groundup train ... distributed.ep=2            # DDP x EP
    torchrun --nproc-per-node 4 -m groundup train ... distributed.strategy=fsdp distributed.ep=2

The processes form groups of `ep` consecutive ranks (the `ep` dimension of an (ep_replica, ep) mesh over
every process). Within a group, process r holds experts [r E/ep, (r+1) E/ep) of every MoE layer as a
DTensor sharded by expert (`Shard(0)`), so a state dict names the whole (E, out, in) stack under the plain
model's names and DCP checkpoints resume under any other layout. Every process still reads its own share
of each batch (data parallelism is over all processes) and routes its tokens with the replicated router.

A layer's forward on each process:
1. route (unchanged: model/moe.py's `MoE.route`), sort the (token, slot) pairs by expert, so that they are
   grouped by the process that holds the expert;
2. exchange the per-expert counts, then the rows, with `all_to_all_single` (uneven splits);
3. run the local experts on the rows received (every local expert runs, on zero rows if none came, so
   that every process's backward reaches every expert parameter);
4. send the outputs back with the reverse all-to-all, weight them by the gate and add them per token.
The all-to-all is an autograd function whose backward is the reverse exchange, so gradients flow back
through the combine and the dispatch.

Gradients. The non-expert parameters are DDP's or FSDP2's as without expert parallelism (the expert
stacks are left out of both). An expert's gradient on its process already sums what every process of
the ep group sent it; a hook on each expert parameter sums it over the `ep_replica` group (the processes
holding the same experts) and divides by the number of processes, DDP's and FSDP's averaging, as each
process's loss is scaled by the number of data-parallel processes (step.py).

Balancing statistics per process (`expert_metrics`, logged with each step): tokens routed to each expert
by this process's data, tokens each local expert received, their max/mean, and the auxiliary loss.
Routing is dropless (no capacity), so no token is ever dropped.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from groundup.errors import ConfigError
from groundup.model.mlp import activation
from groundup.model.moe import MoE, combine, load_imbalance

EXPERT_PARAMS = ("experts_in", "experts_out")


class _AllToAll(torch.autograd.Function):
    """Rows exchanged with uneven splits; backward sends the gradients back the way the rows came."""

    @staticmethod
    def forward(ctx, x, out_splits: list[int], in_splits: list[int], group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """Send `in_splits[p]` rows of `x` (in order) to process p of `group`; receive `out_splits[p]` from each."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


class ExpertParallelMoE(MoE):
    """An MoE layer whose experts are spread over an ep group (see the module docstring). Made from an
    MoE in place by `expert_parallel`; routing, gating and the shared experts are the MoE's own."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        chosen, weights, probs = self.route(x)
        E, P, group = self.n_experts, self.ep_size, self.ep_group
        local = E // P
        flat = chosen.reshape(-1)
        counts = torch.bincount(flat, minlength=E)
        order = torch.argsort(flat, stable=True)  # grouped by expert, hence by the process that holds it
        token_of = order // self.top_k
        # how many rows each process sends each of my experts: (P sources, local experts)
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=group)
        received = received.view(P, local)
        send = counts.view(P, local).sum(1).tolist()
        recv = received.sum(1).tolist()
        rows = all_to_all(x[token_of], recv, send, group)
        # rows arrive by source, and within a source by expert: regroup them by expert to run each once
        expert_of = torch.arange(local, device=x.device).repeat(P).repeat_interleave(received.reshape(-1))
        by_expert = torch.argsort(expert_of, stable=True)
        per_expert = received.sum(0).tolist()
        w_in, w_out = _local(self.experts_in), _local(self.experts_out)
        grouped = rows[by_expert]
        outs, start = [], 0
        for e, n in enumerate(per_expert):  # zero rows too: every local expert is in the graph
            h = grouped[start : start + n] @ w_in[e].t()
            if self.gated:
                gate, up = h.chunk(2, dim=-1)
                h = activation(self.kind, gate) * up
            else:
                h = activation(self.kind, h)
            outs.append(h @ w_out[e].t())
            start += n
        back = torch.empty_like(by_expert)
        back[by_expert] = torch.arange(len(by_expert), device=x.device)
        # back to the processes the rows came from, in the order they sent them
        out = all_to_all(torch.cat(outs)[back], send, recv, group)
        y, aux = combine(self, x, out, weights, order, token_of, counts, probs)
        if self.training:
            with torch.no_grad():
                self.ep_routed += counts.to(self.ep_routed.dtype)
                self.ep_received += received.sum(0).to(self.ep_received.dtype)
            if self.aux_loss_coef:
                self.ep_aux += float(aux.detach())
                self.ep_forwards += 1
        return y.reshape(shape), aux


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def check_ep(model_cfg, ep: int, processes: int | None = None) -> None:
    """Refuse, naming the key, a layout expert parallelism cannot have (`model_cfg` None: not known yet)."""
    if ep == 1:
        return
    if processes is not None and processes % ep:
        raise ConfigError(f"distributed.ep = {ep} must divide the number of processes ({processes})",
                          key="distributed.ep")
    if model_cfg is None:
        return
    if not model_cfg.n_experts:
        raise ConfigError(f"distributed.ep = {ep} with a dense model (model.n_experts = 0): expert parallelism "
                          "splits MoE experts; use distributed.ep = 1", key="distributed.ep")
    if model_cfg.n_experts % ep:
        raise ConfigError(f"distributed.ep = {ep} must divide model.n_experts ({model_cfg.n_experts}): each process "
                          "holds the same number of experts", key="distributed.ep")


def ep_meshes(device_type: str, processes: int, ep: int):
    """(ep mesh, ep_replica process group): groups of `ep` consecutive ranks, and the ranks holding the same experts."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (processes // ep, ep), mesh_dim_names=("ep_replica", "ep"))
    return mesh["ep"], mesh["ep_replica"].get_group()


def expert_parallel(model: nn.Module, ep_mesh, replica_group, processes: int) -> list[str]:
    """Shard every MoE layer's experts over `ep_mesh` in place; returns the expert parameters' names
    (DDP and FSDP2 must leave them alone: their gradients are reduced here, over `replica_group`)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    P = ep_mesh.size()
    check_ep(model.cfg, P)
    replicas = dist.get_world_size(replica_group)
    names = []
    for name, moe in model.named_modules():
        if not isinstance(moe, MoE):
            continue
        moe.__class__ = ExpertParallelMoE
        moe.ep_size, moe.ep_group = P, ep_mesh.get_group()
        local = moe.n_experts // P
        moe.register_buffer("ep_routed", torch.zeros(moe.n_experts, device=moe.load.device), persistent=False)
        moe.register_buffer("ep_received", torch.zeros(local, device=moe.load.device), persistent=False)
        moe.ep_aux, moe.ep_forwards = 0.0, 0
        for pname in EXPERT_PARAMS:
            full = getattr(moe, pname)
            # every process built the same full stack (same seed): keep this process's experts
            shard = nn.Parameter(distribute_tensor(full.detach(), ep_mesh, [Shard(0)], src_data_rank=None),
                                 requires_grad=full.requires_grad)
            for attr in ("is_residual_proj",):
                if hasattr(full, attr):
                    setattr(shard, attr, getattr(full, attr))
            setattr(moe, pname, shard)
            if shard.requires_grad:
                shard.register_hook(_reducer(replica_group, replicas, processes))
            names.append(f"{name}.{pname}")
    return names


def _reducer(group, replicas: int, processes: int):
    from torch.distributed.tensor import DTensor

    def reduce(grad):
        local = grad.to_local().clone()
        if replicas > 1:
            dist.all_reduce(local, group=group)
        local /= processes
        return DTensor.from_local(local, grad.device_mesh, grad.placements, run_check=False)

    return reduce


def expert_metrics(model: nn.Module, d) -> dict:
    """Each process's balancing statistics since the last call (collective: every process calls it at the
    same step), then reset; {} without expert parallelism. Lists are indexed by process (global rank)."""
    layers = [m for m in model.modules() if isinstance(m, ExpertParallelMoE)]
    if not layers or getattr(d, "ep", 1) <= 1:
        return {}
    routed = torch.stack([m.ep_routed for m in layers]).sum(0)
    received = torch.stack([m.ep_received for m in layers]).sum(0)
    aux = sum(m.ep_aux for m in layers) / max(1, sum(m.ep_forwards for m in layers) or 1)
    mine = {"routed": routed.long().tolist(), "received": received.long().tolist(),
            "imbalance": load_imbalance(received) if received.sum() > 0 else 1.0, "aux_loss": aux}
    for m in layers:
        m.ep_routed.zero_()
        m.ep_received.zero_()
        m.ep_aux, m.ep_forwards = 0.0, 0
    everyone = [None] * d.processes
    dist.all_gather_object(everyone, mine)
    return {"ep_tokens_routed": [r["routed"] for r in everyone],  # [process][expert]: this process's data
            "ep_tokens_received": [r["received"] for r in everyone],  # [process][local expert]: summed over layers
            "ep_imbalance": [r["imbalance"] for r in everyone],  # max/mean of the local experts' tokens
            "ep_aux_loss": [r["aux_loss"] for r in everyone],  # mean over layers and micro-batches
            "ep_dropped_tokens": 0}  # dropless routing: no capacity factor
