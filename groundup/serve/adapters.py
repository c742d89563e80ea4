"""Many LoRA adapters on one base model, each row of a batch with its own.

    bank = AdapterBank(model)                      # the served model; its weights exist once
    bank.add("sql", "adapters/sql")                # groundup's or peft's layout (interop/peft_format)
    bank.select([0, 1, 1, 0])                      # before a forward: row b uses adapter ids[b] (0 = base)
    logits = model(tokens, cache=...)

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
"""

from __future__ import annotations

import copy
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

    def set_adapter(self, index: int, a: torch.Tensor, b: torch.Tensor) -> None:
        """Place adapter `index` (1-based) as A (r, in) and scale * B (out, r), growing the stacks."""
        device, dtype = a.device, a.dtype
        count = max(index + 1, 1 if self.A is None else self.A.shape[0])
        rank = max(a.shape[0], 0 if self.A is None else self.A.shape[1])
        A = torch.zeros(count, rank, self.in_features, device=device, dtype=dtype)
        B = torch.zeros(count, self.out_features, rank, device=device, dtype=dtype)
        if self.A is not None:
            A[: self.A.shape[0], : self.A.shape[1]] = self.A
            B[: self.B.shape[0], :, : self.B.shape[2]] = self.B
        A[index, : a.shape[0]] = a
        B[index, :, : b.shape[1]] = b
        self.A, self.B = A, B

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


class AdapterBank:
    """The served adapters: name -> index (0 is the base model), and the wrapped layers."""

    def __init__(self, model: nn.Module):
        self.model = model
        first = next(p for p in model.parameters() if p.is_floating_point())
        self.device, self.dtype = first.device, first.dtype  # the adapters are kept as the model computes
        self.rows = RowAdapters()
        self.names: list[str] = []  # index - 1 -> name
        self.dirs: list[str] = []
        self.layers: dict[str, MultiLoRALinear] = {}

    def __len__(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        return self.names.index(name) + 1

    def add(self, name: str, adapter_dir: str | Path) -> int:
        """Load an adapter (its directory, or a LoRA training run) and make it selectable as `name`;
        returns its index."""

        if name in self.names:
            raise CheckpointError(f"adapter name {name!r} is given twice")
        adapter_dir = resolve_model_dir(adapter_dir)  # an adapter directory, or a LoRA run's newest checkpoint
        if not is_adapter_dir(adapter_dir):
            raise CheckpointError(f"{adapter_dir}: not a LoRA adapter (no adapter_model.safetensors)")
        # A second module tree over the same weight tensors: load_adapter wraps its layers, not ours.
        skeleton = copy.deepcopy(self.model, memo={id(t): t for t in [*self.model.parameters(), *self.model.buffers()]})
        for path in self.layers:  # unwrap our own layers there: load_adapter wraps plain linears
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
        index = len(self.names) + 1
        for path, m in wrapped.items():
            layer = self.layers.get(path) or self._wrap(path, m)
            a, b = _block_diagonal(m)
            layer.set_adapter(index, a.to(self.device, self.dtype), b.to(self.device, self.dtype))
        for layer in self.layers.values():  # layers this adapter leaves alone still need its (zero) slot
            if layer.A.shape[0] <= index:
                layer.set_adapter(index, layer.A.new_zeros(1, layer.in_features),
                                  layer.B.new_zeros(layer.out_features, 1))
        self.names.append(name)
        self.dirs.append(str(adapter_dir))
        return index

    def _wrap(self, path: str, m: LoRALinear) -> MultiLoRALinear:
        parent_path, _, leaf = path.rpartition(".")
        parent = self.model.get_submodule(parent_path) if parent_path else self.model
        layer = MultiLoRALinear(getattr(parent, leaf), self.rows, m.in_features, m.out_features)
        setattr(parent, leaf, layer)
        self.layers[path] = layer
        return layer

    def select(self, ids: list[int]) -> None:
        """Adapter index per row for the next forward (all 0: the base model, no extra work)."""
        if not self.layers or not any(ids):
            self.rows.ids = None
            return
        self.rows.ids = torch.tensor(ids, dtype=torch.long, device=self.device)
