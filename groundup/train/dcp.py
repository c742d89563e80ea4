"""Sharded checkpoints through torch.distributed.checkpoint (DCP): each process writes its own shards.

    RUN/checkpoints/step_0001000/          an FSDP2 or tensor-parallel run's checkpoint
        __0_0.distcp ... __N_0.distcp      each process's shards of the model and optimizer state
        .metadata                          DCP's index of the shards (a pickle; read by SafeReader only)
        model.safetensors  model.toml      the whole model, consolidated from the shards: a model directory
        optimizer_groups.pt                the optimizer's param groups (hyperparameters, parameter names)
        loader.pt  trainer.pt  meta.json   as in checkpoint.py; meta.json holds every file's digest

Saving, on every process: the sharded state (FSDP's and tensor parallelism's DTensors, no gather) is
written by DCP into the step's temporary directory, synchronously or, with `checkpoint.async_save`,
from a CPU copy in a background thread while training continues. Then each process hashes its own
shard files and the main process, once every shard is in, builds model.safetensors from the shards
(so `generate`, `export hf`, `resolve_model_dir` and `checkpoint_problem` need nothing new), writes
meta.json, renames the directory into place and moves `latest`: last, as for every checkpoint, so a
crash at any moment leaves the previous checkpoint the newest intact one. One write is in flight at
a time; rotation happens on the training thread once the write is complete.

Loading: a run with the same sharded layout (any number of processes: DCP re-shards) reads its
shards in place. Any other run (one process, DDP, or tensor parallel against a plain FSDP
checkpoint: the parameter names differ) reads the whole state in each process (`read_full`) and
loads it as a full state dict. DCP's `.metadata` is a pickle. It is our own file, and resume and
rollback read a checkpoint only after meta.json's digests vouch for every file; even so `SafeReader`
unpickles only DCP's metadata classes, torch sizes, dtypes and layouts (anything else is refused,
so reading it cannot run code). Shards hold tensors alone, read with `torch.load(weights_only=True)`,
and a pickled object in them is refused. Readers of the model (generate, export, eval) never
touch the DCP files: they read model.safetensors.
"""

from __future__ import annotations

import io
import pickle
import shutil
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from groundup.errors import CheckpointError
from groundup.io import atomic_write_text, disk_full_error, follow_umask, replace_dir, writing
from groundup.layout import checkpoints_dir, file_digest, latest_pointer, step_name
from groundup.train.checkpoint import GROUPS_FILE, load_plain_pickle
from groundup.train.parallelize import fuse_param_groups, fuse_state, split_names
from groundup.train.pipeline import merge_groups, own_param_groups

MODEL, OPTIM = "model/", "optim/"
FORMAT = "torch.distributed.checkpoint"

# ----------------------------------------------------------------------------- reading without running code

_SAFE = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                              "ChunkStorageMetadata", "TensorProperties", "MetadataIndex",
                                              "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # looks a layout up by name
    "torch": {"Size"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if name in _SAFE.get(module, ()) or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")


class SafeReader(FileSystemReader):
    """FileSystemReader whose `.metadata` unpickling can build DCP's metadata and nothing else."""

    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import StorageMeta

        path = Path(self.path) / ".metadata"
        try:
            metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        except (pickle.UnpicklingError, OSError, EOFError, AttributeError, ValueError) as e:
            raise CheckpointError(f"{path}: refused or unreadable DCP metadata ({e})") from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _TensorsOnly(DefaultLoadPlanner):
    """Our shards hold tensors only; a pickled object (DCP's default for non-tensors) is refused."""

    def load_bytes(self, read_item, value) -> None:
        raise CheckpointError(f"{read_item.dest_index.fqn}: a pickled object in a checkpoint shard; refused")


# ----------------------------------------------------------------------------- the state as DCP sees it


def _flat_state(model, optimizers) -> tuple[dict, dict, dict, dict]:
    """(flat tensors for DCP, model state, optimizer state, non-tensor optimizer slots): sharded, no copies."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    msd = get_model_state_dict(model)
    osd = get_optimizer_state_dict(model, optimizers)
    flat = {MODEL + k: v for k, v in msd.items()}
    scalars: dict = {}
    for fqn, slots in osd["state"].items():
        for slot, value in slots.items():
            if isinstance(value, torch.Tensor):
                flat[f"{OPTIM}{fqn}/{slot}"] = value
            else:
                scalars.setdefault(fqn, {})[slot] = value
    return flat, msd, osd, scalars


def _unflatten(flat: dict) -> tuple[dict, dict]:
    model = {k[len(MODEL):]: v for k, v in flat.items() if k.startswith(MODEL)}
    optim: dict = {}
    for k, v in flat.items():
        if k.startswith(OPTIM):
            fqn, slot = k[len(OPTIM):].rsplit("/", 1)
            optim.setdefault(fqn, {})[slot] = v
    return model, optim


def read_full(step_dir: Path, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a DCP checkpoint whose key starts with `prefix`, whole, in this process (no collectives)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = SafeReader(step_dir)
    entries = reader.read_metadata().state_dict_metadata
    out = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in entries.items()
           if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)}
    # DCP's own one-process loader (what its dcp_to_torch_save uses): `dcp.load(no_dist=True)` is the
    # same call plus a warning that it assumes one process, which is what is meant here.
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    _load_state_dict(out, storage_reader=SafeReader(step_dir), planner=_TensorsOnly(), no_dist=True)
    return out


# ----------------------------------------------------------------------------- saving


@dataclass
class _Write:
    """A checkpoint being written: what the main process needs to finish it, and how it ended."""

    step: int
    tmp: Path
    final: Path
    future: object = None  # DCP's future (async_save), or None once written
    thread: threading.Thread | None = None
    error: BaseException | None = None
    finish: object = None  # the main process's closure: consolidate the model, write the small files, seal
    rotate: object = None  # checkpoint rotation, run on the training thread once this write is complete
    groups: dict = field(default_factory=dict)  # the optimizer's param groups and non-tensor state


class _NamedFileSystem(FileSystem):
    """DCP's files, where a full disk is a DiskFullError naming the shard (torch.save into DCP's stream hides it)."""

    @contextmanager
    def create_stream(self, path, mode: str):
        with (super().create_stream(path, mode) if "r" in mode else writing(path, mode)) as stream:
            yield stream


def _tmp_dir(run_dir: Path, step: int, d) -> Path:
    """The step's temporary directory, made by the main process and named to all (a shared filesystem)."""
    name = None
    if d.is_main:
        parent = checkpoints_dir(run_dir)
        parent.mkdir(parents=True, exist_ok=True)
        name = str(follow_umask(tempfile.mkdtemp(prefix=f".{step_name(step)}.tmp-", dir=parent)))
    return Path(d.broadcast(name))


def start_save(d, model, optimizers, run_dir: Path, step: int, async_save: bool, finish, rotate) -> Path:
    """Write the sharded state of step `step` (every process), then have `finish(tmp, digests, groups)`
    run on the main process once all shards are in; returns the directory the checkpoint will have."""
    settle(d)  # one write at a time; the previous one's failure is raised here, on every process
    tmp = _tmp_dir(run_dir, step, d)
    flat, _, osd, scalars = _flat_state(model, optimizers)
    groups = {"param_groups": osd["param_groups"], "scalars": scalars}
    if getattr(d, "pp", 1) > 1:  # each pipeline stage's optimizer names its own parameters: the file names all
        everyone = [None] * d.processes
        dist.all_gather_object(everyone, groups, group=d.ckpt_group)
        groups = merge_groups(everyone)
    job = _Write(step, tmp, checkpoints_dir(run_dir) / step_name(step), finish=finish, rotate=rotate,
                 groups=groups)
    writer = FileSystemWriter(tmp, single_file_per_rank=True, sync_files=True, thread_count=1)
    writer.fs = _NamedFileSystem()
    if async_save:
        # DCP copies the shards to CPU memory before returning; the file writes and the plan
        # exchange (on the checkpoint group) then run in its thread while training goes on.
        job.future = dcp.async_save(flat, storage_writer=writer, process_group=d.ckpt_group)
        job.thread = threading.Thread(target=_complete, args=(job, d), name=f"checkpoint-{step}", daemon=True)
        job.thread.start()
    else:
        try:
            dcp.save(flat, storage_writer=writer, process_group=d.ckpt_group)
        except CheckpointException as e:  # every process gets it (DCP gathers the failures); settle reports it
            job.error = e
            if d.is_main:
                shutil.rmtree(job.tmp, ignore_errors=True)
        else:
            _complete(job, d)
    d.pending.append(job)
    if not async_save:
        settle(d)
    return job.final


def _complete(job: _Write, d) -> None:
    """After DCP: each process hashes its own shards, the main one gathers the digests and finishes."""
    digests, failure = {}, None
    try:
        if job.future is not None:
            job.future.result()
        mine = [p for p in job.tmp.iterdir() if p.name.startswith(f"__{d.global_rank}_")]
        if d.is_main:
            mine.append(job.tmp / ".metadata")
        digests = {p.name: file_digest(p) for p in mine}
    except BaseException as e:  # noqa: BLE001 - reported by wait_pending, on the training thread
        failure = e
    everyone = [None] * d.processes
    if d.active:  # every process reaches this gather, failed or not, so none waits forever
        dist.all_gather_object(everyone, (digests, repr(failure) if failure else None), group=d.ckpt_group)
    else:
        everyone = [(digests, repr(failure) if failure else None)]
    failures = [f for _, f in everyone if f]
    if failure is not None or failures:
        job.error = failure or CheckpointError(f"step {job.step}: a process failed to write its shards: {failures[0]}")
        if d.is_main:
            shutil.rmtree(job.tmp, ignore_errors=True)
        return
    if d.is_main:
        merged = {name: h for part, _ in everyone for name, h in part.items()}
        try:
            job.finish(job.tmp, merged, job.groups)
            _publish(job.tmp, job.final)
        except BaseException as e:  # noqa: BLE001
            job.error = e
            shutil.rmtree(job.tmp, ignore_errors=True)


def _publish(tmp: Path, final: Path) -> None:
    """Rename the finished directory into place (replacing a same-step one only now) and point `latest` at it."""
    replace_dir(tmp, final)
    atomic_write_text(latest_pointer(final.parent.parent), final.name + "\n")  # last: vouches for it


def _drain(d) -> str | None:
    """Join the write in flight and rotate after it; its failure as this process saw it, or None."""
    message = None
    while d.pending:
        job = d.pending.pop(0)
        if job.thread is not None:
            job.thread.join()
        full = _disk_full(job) if job.error is not None else None
        if full is not None:
            message = (f"disk full writing {full.path}: {full.reason}; the run stops here, and --resume continues "
                       "from the newest complete checkpoint once there is space")
        elif job.error is not None:
            message = (f"the checkpoint of step {job.step} was not saved ({type(job.error).__name__}: {job.error}); "
                       "the run stops here, and --resume continues from the newest complete checkpoint")
        elif d.is_main and job.rotate is not None:
            job.rotate()
    return message


def _disk_full(job: _Write):
    """The write's failure as a DiskFullError naming the file by its final path (or the step), or None: DCP's
    CheckpointException holds each process's own error."""
    failures = getattr(job.error, "failures", None) or {}
    for error in [job.error, *(f[0] if isinstance(f, tuple) else f for f in failures.values())]:
        full = disk_full_error(error, job.final) if isinstance(error, BaseException) else None
        if full is not None:
            inside = Path(full.path)
            return type(full)(job.final / inside.relative_to(job.tmp), full.reason, full.errno) \
                if job.tmp in inside.parents else full
    return None


def settle(d) -> None:
    """Every process: wait for the write in flight; if it failed anywhere, raise the same error everywhere.

    (Only the main process may see a failure of its own part; a lone raise would leave the others
    waiting in their next collective.)"""
    message = _drain(d)
    if d.active:
        messages = [None] * d.processes
        dist.all_gather_object(messages, message)
        message = next((m for m in messages if m), None)
    if message:
        raise CheckpointError(message)


def wait_pending(d, raise_errors: bool = True) -> None:
    """This process alone (no collective: safe on the way out of a failed run): wait for the write in flight."""
    message = _drain(d)
    if message and raise_errors:
        raise CheckpointError(message)
    if message and d.is_main:
        print(f"warning: {message}", flush=True)


# ----------------------------------------------------------------------------- loading


def restore(d, model, optimizers, step_dir: Path, meta: dict, full_loaders) -> None:
    """Load a DCP checkpoint into the model and optimizers, on every process.

    `full_loaders` = (load_model_state, load_optimizer_state): how a full state dict is loaded into
    this run's layout, for the case where its shards do not match the checkpoint's."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    settle(d)
    groups = load_plain_pickle(step_dir / GROUPS_FILE)
    saved = {k: tuple(m.size) for k, m in SafeReader(step_dir).read_metadata().state_dict_metadata.items()}
    if d.sharded:
        flat, msd, osd, scalars = _flat_state(model, optimizers)
        mine = {k: tuple(v.shape) for k, v in flat.items()}
        # The same names and shapes: load the shards (a pipeline stage: its own part of them).
        if saved == mine or (getattr(d, "pp", 1) > 1 and mine.items() <= saved.items()):
            dcp.load(flat, storage_reader=SafeReader(step_dir), planner=_TensorsOnly(), process_group=d.ckpt_group)
            set_model_state_dict(model, msd)
            state = {fqn: {**slots, **groups["scalars"].get(fqn, {})} for fqn, slots in osd["state"].items()}
            param_groups = groups["param_groups"]
            if getattr(d, "pp", 1) > 1:
                param_groups = own_param_groups(model, param_groups)
            set_optimizer_state_dict(model, optimizers, {"state": state, "param_groups": param_groups})
            return
    # Another layout: the whole state in each process, under the plain model's names.
    splits = {k: (tuple(v[0]), list(v[1])) for k, v in meta.get("sharded", {}).get("split_projections", {}).items()}
    model_state, optim_state = _unflatten(read_full(step_dir))
    for fqn, slots in groups["scalars"].items():
        optim_state.setdefault(fqn, {}).update(slots)
    load_model, load_optimizer = full_loaders
    load_model(model, fuse_state(model_state, splits), d)
    load_optimizer(model, optimizers, {"state": fuse_state(optim_state, splits),
                                       "param_groups": fuse_param_groups(groups["param_groups"], splits)}, d)


def consolidate(step_dir: Path, splits: dict) -> dict[str, torch.Tensor]:
    """The whole model's state from the shards, under the plain model's names (main process, no collectives)."""

    model_state, _ = _unflatten(read_full(step_dir, MODEL))
    return fuse_state(model_state, splits)


def describe(d, model) -> dict:
    """What meta.json records about a sharded checkpoint's layout."""

    return {"format": FORMAT, "processes": d.processes, "tp": d.tp, "pp": getattr(d, "pp", 1),
            "split_projections": {k: [list(n), list(s)] for k, (n, s) in split_names(model).items()}}
