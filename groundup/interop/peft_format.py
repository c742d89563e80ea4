"""LoRA adapters in the layout the `peft` library reads, both ways.

    ADAPTER/adapter_config.json         peft's LoraConfig (r, lora_alpha, target_modules, use_rslora, ...)
    ADAPTER/adapter_model.safetensors   base_model.model.<Hugging Face module>.lora_A.weight / lora_B.weight
    ADAPTER/groundup_adapter.json       groundup's LoraConfig, the model config and the base it was trained on

`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(exported_base), ADAPTER)` gives our
logits (tested). Names come from the same rule table as `export hf` (interop/hf_weights.py), so the
adapter of a fused projection is split exactly as its weight is: our qkv_proj's per-part (A, B) pairs
become peft's q_proj/k_proj/v_proj adapters, and row permutations (DeepSeek's RoPE slices) are applied
to B's rows as to the weight's. A model that no standard architecture expresses, or adapters on
routed MoE experts (which peft does not address), are saved under groundup's own module names, and
groundup_adapter.json says so. A peft adapter made elsewhere for a model imported with `import hf`
loads too: parts it does not adapt (peft's common q_proj + v_proj only) get zero updates.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from groundup.config import ConfigError, from_dict
from groundup.errors import CheckpointError
from groundup.interop.hf_config import choose_architecture
from groundup.interop.hf_weights import rules
from groundup.io import atomic_write_json, follow_umask, read_json
from groundup.layout import ADAPTER_CONFIG_FILE, ADAPTER_META_FILE, ADAPTER_WEIGHTS_FILE
from groundup.model.config import ModelConfig
from groundup.model.lora import LoRALinear, LoraConfig, apply_lora, load_adapter_state
from groundup.model.model_dir import check_finite
from groundup.schema import check

PREFIX = "base_model.model."
# The keys of peft's adapter_config.json that groundup reads, with their JSON types (null where peft writes it).
_PEFT_SHAPE = {"peft_type?": (str, None), "r?": (int, None), "lora_alpha?": (float, None), "lora_dropout?": (float, None),
               "target_modules?": (str, [str], None), "use_rslora?": (bool, None)}


def _architecture(model) -> str | None:
    try:
        return choose_architecture(model.cfg, expert_bias_is_zero=all(not m.expert_bias.any() for m in model.moe_layers()))
    except ConfigError:
        return None


def _linear_rules(arch: str, cfg: ModelConfig) -> dict[str, object]:
    return {r.ours[0][: -len(".weight")]: r for r in rules(arch, cfg) if len(r.ours) == 1 and r.ours[0].endswith(".weight")}


def _adapted(model) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def to_peft(model, lora: LoraConfig) -> tuple[dict[str, torch.Tensor], dict, bool]:
    """(tensors under peft's names, adapter_config.json, whether the names are Hugging Face's)."""
    arch = None if lora.adapts_experts() else _architecture(model)
    table = _linear_rules(arch, model.cfg) if arch else {}
    tensors, targets = {}, set()
    for path, m in _adapted(model).items():
        a_parts = m.lora_A.detach().split(m.rank)
        rule = table.get(path)
        if rule is None:  # groundup's own names
            tensors[f"{PREFIX}{path}.lora_A.weight"] = m.lora_A.detach().clone()
            tensors[f"{PREFIX}{path}.lora_B.weight"] = m.lora_B.detach().clone()
            targets.add(path.rsplit(".", 1)[-1])
            continue
        b_parts = rule.to_hf([m.lora_B.detach()])
        if len(b_parts) != len(a_parts):
            raise RuntimeError(f"{path}: {len(a_parts)} adapter parts but {len(b_parts)} Hugging Face tensors")
        for hf_name, a, b in zip(rule.hf, a_parts, b_parts):
            module = hf_name[: -len(".weight")]
            tensors[f"{PREFIX}{module}.lora_A.weight"] = a.clone().contiguous()
            tensors[f"{PREFIX}{module}.lora_B.weight"] = b.clone().contiguous()
            targets.add(module.rsplit(".", 1)[-1])
    if lora.adapts_experts():
        for key, value in model.state_dict().items():
            if "parametrizations." in key and ".lora_" in key:
                clean = key.replace("parametrizations.", "").replace(".0.lora_", ".lora_")
                tensors[f"{PREFIX}{clean}.weight"] = value.detach().clone()
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha,
              "lora_dropout": lora.dropout, "use_rslora": lora.rslora, "target_modules": sorted(targets),
              "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
              "modules_to_save": None, "base_model_name_or_path": None, "revision": None}
    return tensors, config, arch is not None


def save_adapter(model, lora: LoraConfig, out_dir: str | Path, base: str | None = None) -> Path:
    """Write ADAPTER/ (the three files above) into `out_dir`, each atomically."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors, config, hf_names = to_peft(model, lora)
    config["base_model_name_or_path"] = base
    save_file(tensors, str(out_dir / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
    follow_umask(out_dir / ADAPTER_WEIGHTS_FILE)
    atomic_write_json(out_dir / ADAPTER_CONFIG_FILE, config)
    atomic_write_json(out_dir / ADAPTER_META_FILE, {
        "format": "groundup-adapter", "version": 1, "lora": dataclasses.asdict(lora), "hf_names": hf_names,
        "model": dataclasses.asdict(model.cfg), "base": base})
    return out_dir


def adapter_config(adapter_dir: str | Path) -> tuple[LoraConfig, dict]:
    """(LoraConfig, groundup_adapter.json or {}) of an adapter directory, ours or peft's."""
    adapter_dir = Path(adapter_dir)
    meta_path = adapter_dir / ADAPTER_META_FILE
    if meta_path.is_file():
        meta = read_json(meta_path, expect=dict, error=CheckpointError)
        return from_dict(LoraConfig, dict(meta.get("lora") or {}), prefix=f"{meta_path}: "), meta
    peft = read_json(adapter_dir / ADAPTER_CONFIG_FILE, expect=dict, error=CheckpointError)
    check(peft, _PEFT_SHAPE, str(adapter_dir / ADAPTER_CONFIG_FILE))
    if peft.get("peft_type", "LORA") != "LORA":
        raise CheckpointError(f"{adapter_dir / ADAPTER_CONFIG_FILE}: peft_type {peft.get('peft_type')!r}; only LORA loads")
    names = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
             "up_proj": "gate_up_proj", "o_proj": "o_proj", "down_proj": "down_proj"}
    targets = peft.get("target_modules") or []
    if isinstance(targets, str) or any(t not in names for t in targets):
        raise CheckpointError(f"{adapter_dir / ADAPTER_CONFIG_FILE}: target_modules {targets!r}: groundup loads "
                              f"adapters on {', '.join(sorted(names))}")
    given = {k: v for k, v in peft.items() if v is not None}  # null: peft's default
    lora = LoraConfig(rank=given.get("r", 8), alpha=float(given.get("lora_alpha", 8)),
                      dropout=float(given.get("lora_dropout", 0.0)), targets=sorted({names[t] for t in targets}),
                      rslora=given.get("use_rslora", False))
    try:
        lora.validate()
    except ConfigError as e:
        raise CheckpointError(f"{adapter_dir / ADAPTER_CONFIG_FILE}: {e}") from None
    return lora, {"hf_names": True}


def from_peft(model, tensors: dict[str, torch.Tensor], hf_names: bool, where: str) -> dict[str, torch.Tensor]:
    """Our adapter state (module path -> lora_A/lora_B) from peft-named tensors, for a model with the
    adapters applied; parts the file does not adapt stay zero."""
    arch = _architecture(model) if hf_names else None
    if hf_names and arch is None:
        raise CheckpointError(f"{where}: Hugging Face names, but this model has no Hugging Face architecture")
    table = _linear_rules(arch, model.cfg) if arch else {}
    state, used = {}, set()
    for path, m in _adapted(model).items():
        rule = table.get(path)
        if rule is None:
            keys = (f"{PREFIX}{path}.lora_A.weight", f"{PREFIX}{path}.lora_B.weight")
            if keys[0] in tensors and keys[1] in tensors:
                state[f"{path}.lora_A"], state[f"{path}.lora_B"] = tensors[keys[0]], tensors[keys[1]]
                used.update(keys)
            continue
        a_parts, b_parts = list(m.lora_A.detach().zero_().split(m.rank)), []
        shapes = [b.shape for b in rule.to_hf([torch.zeros_like(m.lora_B)])]
        for i, hf_name in enumerate(rule.hf):
            module = hf_name[: -len(".weight")]
            ka, kb = f"{PREFIX}{module}.lora_A.weight", f"{PREFIX}{module}.lora_B.weight"
            if ka in tensors and kb in tensors:
                a_parts[i] = tensors[ka]
                b_parts.append(tensors[kb])
                used.update((ka, kb))
            else:
                b_parts.append(torch.zeros(shapes[i]))
        state[f"{path}.lora_A"] = torch.cat(a_parts)
        state[f"{path}.lora_B"] = rule.from_hf(b_parts)[0]
    for key, value in tensors.items():
        if key not in used and (".experts_in.lora_" in key or ".experts_out.lora_" in key):
            state[key[len(PREFIX): -len(".weight")]] = value
            used.add(key)
    unused = sorted(set(tensors) - used)
    if unused:
        raise CheckpointError(f"{where}: tensors that fit no adapted module of this model: {', '.join(unused[:3])}")
    return state


def read_adapter_state(model, adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """The adapter tensors of ADAPTER/ under our module names, for a model whose adapters are applied."""
    adapter_dir = Path(adapter_dir)
    _, meta = adapter_config(adapter_dir)
    weights = adapter_dir / ADAPTER_WEIGHTS_FILE
    try:
        tensors = load_file(str(weights))
    except (OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{weights}: unreadable safetensors file ({e})") from None
    check_finite(tensors, str(weights))
    state = from_peft(model, tensors, bool(meta.get("hf_names", True)), str(weights))
    return {k: v.to(model.device) for k, v in state.items()}


def load_adapter(model, adapter_dir: str | Path) -> LoraConfig:
    """Apply and load an adapter directory (ours or peft's) onto `model` in place; returns its config.
    An adapter that does not fit the model (made for a base of another shape, or on layers it lacks) is a
    CheckpointError naming the directory: the one check that generate, chat, eval, merge and serve share."""

    adapter_dir = Path(adapter_dir)
    lora, _ = adapter_config(adapter_dir)
    try:
        apply_lora(model, lora)
        load_adapter_state(model, read_adapter_state(model, adapter_dir), str(adapter_dir / ADAPTER_WEIGHTS_FILE))
    except (RuntimeError, ValueError) as e:  # shapes or layers that do not fit (torch's cat, reshape, load)
        raise CheckpointError(f"{adapter_dir}: does not fit this model ({str(e).splitlines()[0]})") from None
    return lora
