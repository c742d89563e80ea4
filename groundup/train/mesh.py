"""The named device mesh of an HSDP or pipelined run: which processes pipeline, replicate, shard and split heads.

    torchrun --nnodes 4 --nproc-per-node 8 -m groundup train ... distributed.strategy=hsdp   # 4 replicas x 8 shards
    torchrun --nproc-per-node 4 -m groundup train ... distributed.strategy=fsdp distributed.pp=2  # PP 2 x FSDP 2

Dimensions, outermost first (torchtitan's order): `pp` (pipeline stages), then the data-parallel
dimensions, `dp` (FSDP2) or `replicate` x `shard` (HSDP), then `tp`. So a stage's processes are
consecutive ranks, a shard group (HSDP) or tensor-parallel group is consecutive ranks inside it, and
with torchrun's rank order a shard group stays on one node: HSDP's reduce-scatters and all-gathers
run over the fast links inside a node, and only the replicas' gradient all-reduce crosses nodes.

HSDP is FSDP2's own hybrid sharding: `fully_shard(module, mesh=mesh["replicate", "shard"])` shards each
parameter over `shard` and keeps one such sharded copy per `replicate` group; gradients are
reduce-scattered within a replica and all-reduced across replicas. `distributed.replicas = 0` derives
the replicas from the launch: one per node (LOCAL_WORLD_SIZE processes each).

A plain FSDP2 run without pipeline stages keeps its unnamed 1-D mesh, and FSDP2 x TP its (dp, tp) mesh
(distributed.py builds those): checkpoints and tests of those layouts see nothing new.
"""

from __future__ import annotations

from groundup.errors import ConfigError

DATA_DIMS = ("dp", "replicate", "shard")


def hsdp_replicas(dc, processes: int, local_world: int) -> int:
    """HSDP's replica groups: `distributed.replicas`, or one per node (shard within a node, replicate across)."""
    per_stage = processes // (dc.pp * dc.tp)
    if dc.replicas:
        if per_stage % dc.replicas:
            raise ConfigError(f"distributed.replicas = {dc.replicas} must divide the data-parallel processes "
                              f"({per_stage} = {processes} processes / pp {dc.pp} / tp {dc.tp})",
                              key="distributed.replicas")
        return dc.replicas
    shard = min(per_stage, max(1, local_world // dc.tp))  # a node's processes, within one stage
    return per_stage // shard if per_stage % shard == 0 else 1


def mesh_dims(dc, processes: int, local_world: int) -> list[tuple[str, int]]:
    """[(name, size)] of the mesh, outermost first; the sizes multiply to `processes`."""
    if processes % (dc.pp * dc.tp):
        raise ConfigError(f"distributed.pp x distributed.tp = {dc.pp} x {dc.tp} must divide the number of processes "
                          f"({processes}): pp x tp x data-parallel = processes", key="distributed.pp")
    dp = processes // (dc.pp * dc.tp)
    dims = [("pp", dc.pp)] if dc.pp > 1 else []
    if dc.strategy == "hsdp":
        replicas = hsdp_replicas(dc, processes, local_world)
        dims += [("replicate", replicas), ("shard", dp // replicas)]
    else:
        dims.append(("dp", dp))
    if dc.tp > 1:
        dims.append(("tp", dc.tp))
    return dims


def build_mesh(device_type: str, dims: list[tuple[str, int]]):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, tuple(s for _, s in dims), mesh_dim_names=tuple(n for n, _ in dims))


def data_mesh(mesh):
    """The data-parallel part of `mesh` that FSDP2 shards over: 1-D (FSDP) or 2-D (replicate, shard: HSDP)."""
    names = tuple(mesh.mesh_dim_names or ())
    dims = tuple(n for n in names if n in DATA_DIMS)
    if not names or dims == names:
        return mesh
    return mesh[dims[0]] if len(dims) == 1 else mesh[dims]


def coordinates(dims: list[tuple[str, int]], rank: int) -> dict[str, int]:
    """This global rank's index along each mesh dimension (row-major, as init_device_mesh lays ranks out)."""
    out = {}
    for name, size in reversed(dims):
        out[name] = rank % size
        rank //= size
    return out
