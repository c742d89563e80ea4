"""Many LoRA adapters on one base model, each row of a batch with its own.

    bank = AdapterBank(model)                      # the served model; its weights exist once
    bank.add("sql", "adapters/sql")                # groundup's or peft's layout (interop/peft_format)
    bank.select([0, 1, 1, 0])                      # before a forward: row b uses adapter ids[b] (0 = base)
    logits = model(tokens, cache=...)
    bank.remove("sql")                             # its index is free for the next load

Every linear layer some adapter targets is wrapped once in a `MultiLoRALinear`, which computes

    y_b = base(x_b) + B[i_b] @ (A[i_b] @ x_b)        (i_b: row b's adapter; adapter 0 is all zeros)

with the adapters' A (R x in) and B (out x R) stacked per layer and gathered per row for two batched
matmuls (`torch.bmm`), so rows of different adapters share one forward. An adapter's per-part pairs
on a fused projection (q, k, v of `qkv_proj`; gate, up of `gate_up_proj`) become one block-diagonal
B, its scale is folded into B, and ranks are zero-padded to the largest, so each row computes
exactly `LoRALinear.delta()` applied to x: outputs equal the merged model's (`merge_lora`) to
float rounding (tested to 1e-4). A batch of base-model rows skips the adapters entirely.

Not served: adapters on routed MoE experts (a weight parametrization, not a layer) and, with MLA,
on `kv_up` (decoding reads its weight directly, which cannot differ per row); both are refused
when the adapter is loaded.

At run time (the server's /v1/load_lora_adapter and /v1/unload_lora_adapter, serve/adapter_updates.py)
loading is split in two: `prepare` reads and checks the files and builds each layer's (A, B) without
touching the bank, so it can run beside the engine; `install` and `remove` change the bank and must run
between engine steps (the scheduler runs them there). An unloaded adapter's index is reused by a later
load, so every load gets a fresh `cache_key`, which the engine chains prefix-cache keys from: blocks
cached for the index's previous adapter never match again. The stacks are replaced, never written in
place, so a compiled decode step (whose weights are frozen into its graph) sees new tensors and compiles
again instead of reading stale ones.
"""

from __future__ import annotations

import copy
import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils import parametrize

from groundup.errors import CheckpointError
from groundup.interop.peft_format import load_adapter
from groundup.layout import is_adapter_dir, resolve_model_dir
from groundup.model.lora import LoRALinear


class RowAdapters:
    """What every wrapped layer reads: the adapter index of each row of the current forward."""

    def __init__(self):
        self.ids: torch.Tensor | None = None  # (B,) long; None = every row uses the base model


class MultiLoRALinear(nn.Module):
    def __init__(self, base: nn.Module, rows: RowAdapters, in_features: int, out_features: int):
        super().__init__()
        self.base, self.rows = base, rows
        self.in_features, self.out_features = in_features, out_features
        # Buffers (not saved), so a module-tree copy that shares the model's tensors shares these too.
        self.register_buffer("A", None, persistent=False)  # (n_adapters + 1, R, in)
        self.register_buffer("B", None, persistent=False)  # (n_adapters + 1, out, R), scale folded in

    def set_adapter(self, index: int, a: torch.Tensor | None, b: torch.Tensor | None, count: int) -> None:
        """Place adapter `index` (1-based) as A (r, in) and scale * B (out, r), or zeros where `a` is None, in
        new stacks of `count` rows (row 0, the base model, stays zero; rows past `count` are dropped)."""
        old = self.A
        ref = a if a is not None else old
        rank = max(0 if a is None else a.shape[0], 0 if old is None else old.shape[1])
        A = torch.zeros(count, rank, self.in_features, device=ref.device, dtype=ref.dtype)
        B = torch.zeros(count, self.out_features, rank, device=ref.device, dtype=ref.dtype)
        if old is not None:
            keep = min(count, old.shape[0])
            A[:keep, : old.shape[1]] = old[:keep]
            B[:keep, :, : old.shape[1]] = self.B[:keep]
        if index < count:
            A[index], B[index] = 0, 0
            if a is not None:
                A[index, : a.shape[0]] = a
                B[index, :, : b.shape[1]] = b
        self.A, self.B = A, B  # new tensors, never written in place (see the module's docstring)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        ids = self.rows.ids
        if ids is None or self.A is None:
            return y
        shape = x.shape
        x3 = x.reshape(shape[0], -1, shape[-1])  # (B, T, in)
        a = self.A.index_select(0, ids).to(x.dtype)  # (B, R, in)
        b = self.B.index_select(0, ids).to(x.dtype)  # (B, out, R)
        delta = torch.bmm(torch.bmm(x3, a.transpose(1, 2)), b.transpose(1, 2))
        return y + delta.reshape(*shape[:-1], self.out_features)


def _block_diagonal(m: LoRALinear) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) with B @ A == m.delta(): per-part B rows placed against their part's A rows."""
    r = m.rank
    a = m.lora_A.detach()
    b = torch.zeros(m.out_features, len(m.parts) * r, device=a.device, dtype=a.dtype)
    row = 0
    for j, (size, part_b) in enumerate(zip(m.parts, m.lora_B.detach().split(m.parts))):
        b[row : row + size, j * r : (j + 1) * r] = part_b
        row += size
    return a, b * m.scale


@dataclass(frozen=True)
class Slot:
    """One loaded adapter: its served name, its directory, when it was loaded and its prefix-cache key."""

    name: str
    dir: str
    created: int
    cache_key: int


@dataclass
class Prepared:
    """An adapter read and checked, not yet in the bank: per wrapped layer path, (A, B, in, out)."""

    dir: str
    layers: dict[str, tuple[torch.Tensor, torch.Tensor, int, int]]


_keys = itertools.count(1)  # 0 is the base model's


class AdapterBank:
    """The served adapters: name -> index (0 is the base model), and the wrapped layers."""

    def __init__(self, model: nn.Module):
        self.model = model
        first = next(p for p in model.parameters() if p.is_floating_point())
        self.device, self.dtype = first.device, first.dtype  # the adapters are kept as the model computes
        self.rows = RowAdapters()
        self.slots: list[Slot | None] = []  # index - 1 -> the adapter there (None: free for the next load)
        self.layers: dict[str, MultiLoRALinear] = {}

    def __len__(self) -> int:
        return sum(s is not None for s in self.slots)

    def loaded(self) -> list[tuple[int, Slot]]:
        """(index, slot) of every loaded adapter, in index order."""
        return [(i + 1, s) for i, s in enumerate(list(self.slots)) if s is not None]

    @property
    def names(self) -> list[str]:
        return [s.name for _, s in self.loaded()]

    @property
    def dirs(self) -> list[str]:
        return [s.dir for _, s in self.loaded()]

    def find(self, name: str) -> int | None:
        return next((i for i, s in self.loaded() if s.name == name), None)

    def index(self, name: str) -> int:
        found = self.find(name)
        if found is None:
            raise KeyError(f"no adapter named {name!r}")
        return found

    def live(self, index: int) -> bool:
        slots = self.slots
        return 0 < index <= len(slots) and slots[index - 1] is not None

    def cache_key(self, index: int) -> int:
        """What prefix-cache keys of rows using `index` chain from: unique per load (0: the base model)."""
        slot = self.slots[index - 1] if 0 < index <= len(self.slots) else None
        return 0 if slot is None else slot.cache_key

    def add(self, name: str, adapter_dir: str | Path) -> int:
        """Load an adapter (its directory, or a LoRA training run) and make it selectable as `name`;
        returns its index."""
        if self.find(name) is not None:
            raise CheckpointError(f"adapter name {name!r} is given twice")
        return self.install(name, self.prepare(adapter_dir))

    def prepare(self, adapter_dir: str | Path) -> Prepared:
        """Read and check an adapter for this model (safetensors and JSON only); the bank is not changed."""
        adapter_dir = resolve_model_dir(adapter_dir)  # an adapter directory, or a LoRA run's newest checkpoint
        if not is_adapter_dir(adapter_dir):
            raise CheckpointError(f"{adapter_dir}: not a LoRA adapter (no adapter_model.safetensors)")
        # A second module tree over the same weight tensors: load_adapter wraps its layers, not ours.
        skeleton = copy.deepcopy(self.model, memo={id(t): t for t in [*self.model.parameters(), *self.model.buffers()]})
        for path in list(self.layers):  # unwrap our own layers there: load_adapter wraps plain linears
            parent_path, _, leaf = path.rpartition(".")
            parent = skeleton.get_submodule(parent_path) if parent_path else skeleton
            setattr(parent, leaf, getattr(parent, leaf).base)
        try:
            load_adapter(skeleton, adapter_dir)
        except (RuntimeError, ValueError) as e:  # shapes or layers that do not fit this model
            raise CheckpointError(f"{adapter_dir}: does not fit this model ({str(e).splitlines()[0]})") from None
        if any(parametrize.is_parametrized(m) for m in skeleton.modules()):
            raise CheckpointError(f"{adapter_dir}: adapters on routed MoE experts cannot be served per row; "
                                  "merge it into the model instead (groundup.model.lora.merge_lora)")
        wrapped = {path: m for path, m in skeleton.named_modules() if isinstance(m, LoRALinear)}
        if getattr(self.model.cfg, "attention", "") == "mla" and any(p.endswith("kv_up") for p in wrapped):
            raise CheckpointError(f"{adapter_dir}: an adapter on MLA's kv_up cannot be served per row "
                                  "(decoding reads that weight directly); merge it instead")
        layers = {}
        for path, m in wrapped.items():
            a, b = _block_diagonal(m)
            layers[path] = (a.to(self.device, self.dtype), b.to(self.device, self.dtype), m.in_features, m.out_features)
        return Prepared(str(adapter_dir), layers)

    def install(self, name: str, prepared: Prepared) -> int:
        """Make a prepared adapter selectable as `name` at the first free index; returns the index.
        While serving, only between engine steps."""
        if self.find(name) is not None:
            raise CheckpointError(f"adapter name {name!r} is already loaded")
        index = next((i + 1 for i, s in enumerate(self.slots) if s is None), len(self.slots) + 1)
        count = max(index, len(self.slots)) + 1
        for path, (a, b, n_in, n_out) in prepared.layers.items():
            layer = self.layers.get(path) or self._wrap(path, n_in, n_out)
            layer.set_adapter(index, a, b, count)
        for path, layer in self.layers.items():  # the others get a zero slot (a reused index may hold an old one)
            if path not in prepared.layers:
                layer.set_adapter(index, None, None, count)
        slot = Slot(name, prepared.dir, int(time.time()), next(_keys))
        if index > len(self.slots):
            self.slots.append(slot)
        else:
            self.slots[index - 1] = slot
        return index

    def remove(self, name: str) -> int:
        """Unload `name` (no request may be using it); its index is free for the next load. While serving,
        only between engine steps."""
        index = self.index(name)
        self.slots[index - 1] = None
        while self.slots and self.slots[-1] is None:
            self.slots.pop()
        for layer in self.layers.values():
            layer.set_adapter(index, None, None, len(self.slots) + 1)
        return index

    def _wrap(self, path: str, in_features: int, out_features: int) -> MultiLoRALinear:
        parent_path, _, leaf = path.rpartition(".")
        parent = self.model.get_submodule(parent_path) if parent_path else self.model
        layer = MultiLoRALinear(getattr(parent, leaf), self.rows, in_features, out_features)
        setattr(parent, leaf, layer)
        self.layers[path] = layer
        return layer

    def select(self, ids: list[int]) -> None:
        """Adapter index per row for the next forward (all 0: the base model, no extra work)."""
        if not self.layers or not any(ids):
            self.rows.ids = None
            return
        self.rows.ids = torch.tensor(ids, dtype=torch.long, device=self.device)
