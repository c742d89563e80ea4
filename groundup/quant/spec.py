"""What a quantized model records about its quantization: the `[quantization]` table of model.toml.

    [quantization]
    version = 1
    method = "gptq"            # int8 | int4 | gptq (how the integers were found)
    bits = 4                   # 8: the int8 format, 4: the int4 format (formats.py)
    group_size = 128           # int4 only
    act_order = true           # gptq only; the stored weight is in the original column order
    include_embeddings = false
    calibration_tokens = 16384 # gptq only
    modules = ["blocks.0.attn.qkv_proj", ..., "blocks.1.mlp.experts_in", "blocks.1.mlp.experts_out"]

`modules` names the quantized weights: a linear layer's module name, `embed` / `lm_head`, or a
MoE module's `experts_in` / `experts_out` (its stacked experts; its router stays float).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from groundup.config import ConfigError, did_you_mean
from groundup.quant.formats import GROUP_SIZES

METHODS = ("int8", "int4", "gptq")
SPEC_VERSION = 1


@dataclass
class QuantSpec:
    method: str
    bits: int
    group_size: int | None = None
    act_order: bool = False
    include_embeddings: bool = False
    calibration_tokens: int | None = None
    modules: list[str] = field(default_factory=list)
    version: int = SPEC_VERSION

    @property
    def fmt(self) -> str:
        return "int8" if self.bits == 8 else "int4"

    @classmethod
    def make(cls, method: str, bits: int | None = None, group_size: int | None = None, act_order: bool = False,
             include_embeddings: bool = False) -> "QuantSpec":
        """A validated spec from what a user asks for (ConfigError naming the option otherwise)."""
        if method not in METHODS:
            raise ConfigError(f"--method {method!r}: unknown quantization method{did_you_mean(method, METHODS)}; "
                              f"expected one of {', '.join(METHODS)}", key="method")
        implied = {"int8": 8, "int4": 4}.get(method)
        if bits is None:
            bits = implied or 4
        if bits not in (4, 8):
            raise ConfigError(f"--bits {bits}: expected 4 or 8", key="bits")
        if implied and bits != implied:
            raise ConfigError(f"--bits {bits} contradicts --method {method} ({implied}-bit); use --method gptq "
                              f"--bits {bits} for GPTQ at {bits} bits, or leave --bits out", key="bits")
        if bits == 8:
            if group_size is not None:
                raise ConfigError(f"--group-size {group_size}: 8-bit weights are scaled per output channel; "
                                  "group sizes apply to 4-bit only", key="group_size")
        else:
            group_size = 128 if group_size is None else group_size
            if group_size not in GROUP_SIZES:
                raise ConfigError(f"--group-size {group_size}: expected one of {', '.join(map(str, GROUP_SIZES))}",
                                  key="group_size")
        if act_order and method != "gptq":
            raise ConfigError(f"--act-order applies to --method gptq only, not {method}", key="act_order")
        return cls(method=method, bits=bits, group_size=group_size, act_order=act_order,
                   include_embeddings=include_embeddings)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict, where: str) -> "QuantSpec":
        """The spec a model.toml records; anything malformed is a ValueError naming `where` and the key."""
        def bad(key: str, expected: str):
            raise ValueError(f"{where}: [quantization] {key} = {data.get(key)!r}: expected {expected}")

        known = set(cls.__dataclass_fields__)
        for key in data:
            if key not in known:
                raise ValueError(f"{where}: [quantization] has unknown key {key!r}{did_you_mean(key, known)}")
        if data.get("version", SPEC_VERSION) != SPEC_VERSION:
            bad("version", f"{SPEC_VERSION} (written by another groundup version)")
        if data.get("method") not in METHODS:
            bad("method", " | ".join(METHODS))
        if data.get("bits") not in (4, 8) or isinstance(data.get("bits"), bool):
            bad("bits", "4 or 8")
        if data["bits"] == 4 and data.get("group_size") not in GROUP_SIZES:
            bad("group_size", " | ".join(map(str, GROUP_SIZES)))
        modules = data.get("modules")
        if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
            bad("modules", "a list of module names")
        for key in ("act_order", "include_embeddings"):
            if not isinstance(data.get(key, False), bool):
                bad(key, "true or false")
        tokens = data.get("calibration_tokens")
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool)):
            bad("calibration_tokens", "an integer")
        return cls(method=data["method"], bits=data["bits"], group_size=data.get("group_size") if data["bits"] == 4
                   else None, act_order=data.get("act_order", False),
                   include_embeddings=data.get("include_embeddings", False), calibration_tokens=tokens,
                   modules=list(modules))

    def describe(self) -> str:
        group = f", groups of {self.group_size}" if self.group_size else ", per output channel"
        order = ", act-order" if self.act_order else ""
        return f"{self.method} ({self.bits}-bit{group}{order})"
