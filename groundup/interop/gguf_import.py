"""`groundup import gguf FILE --out DIR`: a llama.cpp GGUF file as a groundup model directory.

    arch, no_tokenizer = import_gguf("SmolLM2-135M-Q8_0.gguf", "out/smollm")

Architectures: `llama` (Llama 1/2/3, Mistral without a sliding window, SmolLM and the others llama.cpp
stores with the llama layout), `qwen2` (biases on q, k, v) and `qwen3` (QK-norm). Tensor types
F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K are dequantized with the `gguf` package;
anything else, an unknown architecture, MoE, RoPE scaling groundup cannot compute (YaRN, Llama 3's
`rope_freqs`) or partial rotary embeddings are refused by name before anything is written.

The metadata (`{arch}.block_count`, `.embedding_length`, `.feed_forward_length`, `.attention.*`,
`.rope.*`, `.context_length`) becomes a ModelConfig; tensors are renamed to transformers' names and
go through the same Rule table as `import hf` (so q/k/v and gate/up are fused one way only).
llama.cpp's converter permutes the rows of Q and K (and their biases) into its interleaved RoPE
layout for the `llama` architecture only (qwen2/qwen3 use NEOX RoPE, which is groundup's
rotate-half); that permutation is undone, as transformers' GGUF loader does. The tokenizer becomes
OUT/tokenizer (see gguf_tokenizer); one that cannot be rebuilt does not stop the import.

Dtype: --dtype, else float16 or bfloat16 when every matrix is stored so, else float32 (a quantized
value times its scale needs more mantissa than half precision has). OUT is written through
`atomic_dir` (complete or absent) and an existing non-empty OUT is replaced only with `overwrite`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from groundup.config import ConfigError, from_dict
from groundup.device import resolve_dtype
from groundup.errors import CheckpointError, DataError
from groundup.interop.gguf_tokenizer import tokenizer_from_gguf
from groundup.interop.hf_weights import from_hf_state
from groundup.io import atomic_dir
from groundup.layout import TOKENIZER_DIR, claim_output_dir, mark_output_dir
from groundup.model.config import ModelConfig
from groundup.model.model_dir import build_from_state, check_finite, save_model
from groundup.tokenizer.hf_tokenizer import HFTokenizer

ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}  # GGUF name -> the Rule table's
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
          "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj",
          "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def _gguf():
    try:
        import gguf
    except ImportError:
        raise CheckpointError("reading GGUF files needs the gguf package (pip install gguf)") from None
    return gguf


def read_gguf(path: Path):
    """(reader, metadata dict); CheckpointError naming the file when it is not a readable GGUF file."""
    gguf = _gguf()
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file")
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError) as e:
        raise CheckpointError(f"{path}: not a readable GGUF file ({e})") from None
    meta: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            meta[name] = field.contents()
        except UnicodeDecodeError:
            raise CheckpointError(f"{path}: metadata {name} is not valid UTF-8") from None
    return reader, meta


def hf_name(name: str) -> str | None:
    """transformers' name of a GGUF tensor of these architectures (None: not one groundup maps)."""
    stem, _, suffix = name.rpartition(".")
    if stem in _GLOBAL and suffix in ("weight", "bias"):
        return f"{_GLOBAL[stem]}.{suffix}"
    m = _BLOCK.match(name)
    if m and m.group(2) in _LAYER:
        return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"
    return None


def model_config_from_gguf(meta: dict, names: set[str], shapes: dict[str, tuple],
                           where: str) -> tuple[str, ModelConfig]:
    """(arch, ModelConfig) of the file's metadata; ConfigError names what groundup cannot compute."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ConfigError(f"{where}: general.architecture = {arch!r} is not importable; supported: "
                          f"{', '.join(ARCHITECTURES)}", key="general.architecture")

    def refuse(key: str, why: str):
        raise ConfigError(f"{where}: cannot import {arch}.{key} = {meta.get(f'{arch}.{key}')!r}: {why}", key=key)

    def need(key: str, kind=int):
        value = meta.get(f"{arch}.{key}")
        if value is None:
            raise ConfigError(f"{where}: missing {arch}.{key}, which {arch} needs", key=key)
        if not isinstance(value, kind) or isinstance(value, bool):
            refuse(key, "expected one number for every layer (per-layer values are not supported)")
        return value

    d_model, n_heads = need("embedding_length"), need("attention.head_count")
    n_kv = meta.get(f"{arch}.attention.head_count_kv", n_heads)
    if not isinstance(n_kv, int):
        refuse("attention.head_count_kv", "groundup uses one number of KV heads for every layer")
    head_dim = meta.get(f"{arch}.attention.key_length") or d_model // n_heads
    if meta.get(f"{arch}.attention.value_length", head_dim) != head_dim:
        refuse("attention.value_length", f"groundup's values have the keys' head size ({head_dim})")
    if meta.get(f"{arch}.rope.dimension_count", head_dim) != head_dim:
        refuse("rope.dimension_count", f"groundup rotates the whole head ({head_dim}), not part of it")
    if meta.get(f"{arch}.expert_count"):
        refuse("expert_count", "GGUF import reads dense models only")
    window = meta.get(f"{arch}.attention.sliding_window")
    if window and window < need("context_length"):
        refuse("attention.sliding_window", "groundup has no sliding-window attention")
    if "rope_freqs.weight" in names:
        raise ConfigError(f"{where}: cannot import tensor rope_freqs.weight: it holds Llama 3.1-style RoPE scaling, "
                          "which groundup does not compute", key="rope_freqs")
    f: dict[str, Any] = dict(
        name=meta.get("general.name") or arch, vocab_size=shapes["token_embd.weight"][0], d_model=d_model,
        n_layers=need("block_count"), n_heads=n_heads, n_kv_heads=n_kv, max_seq_len=need("context_length"),
        d_ff=need("feed_forward_length"), norm_eps=float(need("attention.layer_norm_rms_epsilon", float)),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)), mlp="swiglu",
        tie_embeddings="output.weight" not in names, qk_norm="blk.0.attn_q_norm.weight" in names)
    if head_dim != d_model // n_heads:
        f["head_dim"] = head_dim
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        f.update(rope_scaling="linear", rope_scaling_factor=float(need("rope.scaling.factor", (int, float))))
    elif scaling != "none":
        refuse("rope.scaling.type", "groundup implements linear RoPE scaling only")
    f.update(_biases(names, where))
    return ARCHITECTURES[arch], from_dict(ModelConfig, f, prefix=f"{where}: ")


def _biases(names: set[str], where: str) -> dict:
    has = lambda part: f"blk.0.{part}.bias" in names  # noqa: E731
    qkv, others = [has(p) for p in ("attn_q", "attn_k", "attn_v")], [has(p) for p in ("attn_output", "ffn_gate",
                                                                                   "ffn_up", "ffn_down")]
    if all(qkv) and all(others):
        return {"bias": True}
    if all(qkv) and not any(others):
        return {"qkv_bias": True}
    if any(qkv) or any(others):
        raise ConfigError(f"{where}: cannot import biases on only some of q, k, v, o and the MLP: groundup biases "
                          "q, k, v (qkv_bias) or every linear layer (bias)", key="bias")
    return {}


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's permute(): rows of each head stored as interleaved RoPE pairs -> rotate-half."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _default_dtype(tensors) -> torch.dtype:
    stored = {t.tensor_type.name for t in tensors if len(t.shape) >= 2}
    halves = {frozenset({"F16"}): torch.float16, frozenset({"BF16"}): torch.bfloat16}
    return halves.get(frozenset(stored), torch.float32)


def import_gguf(path: str | Path, out: str | Path, dtype: str | None = None,
                overwrite: bool = False) -> tuple[str, str | None]:
    """Write the groundup model directory; returns (GGUF architecture, why no tokenizer came along or None)."""

    gguf, path = _gguf(), Path(path)
    reader, meta = read_gguf(path)
    where = str(path)
    for t in reader.tensors:  # before anything else: an unsupported type is refused by name
        if t.tensor_type.name not in TYPES:
            raise CheckpointError(f"{where}: tensor {t.name} is {t.tensor_type.name}; groundup dequantizes "
                                  f"{', '.join(TYPES)}")
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}
    if "token_embd.weight" not in shapes:
        raise CheckpointError(f"{where}: no token_embd.weight tensor")
    arch, cfg = model_config_from_gguf(meta, set(shapes), shapes, where)
    unknown = [t.name for t in reader.tensors if hf_name(t.name) is None]
    if unknown:
        raise CheckpointError(f"{where}: tensors groundup does not map for {meta['general.architecture']}: "
                              f"{', '.join(unknown[:5])}")
    claim_output_dir(out, "import gguf", overwrite=overwrite, sources=[path])
    target = resolve_dtype(dtype) if dtype else _default_dtype(reader.tensors)
    permuted = meta["general.architecture"] == "llama"
    state = {}
    for t in reader.tensors:
        w = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)  # a copy: the file is mapped
        part = t.name.split(".")[-2]
        if permuted and part in ("attn_q", "attn_k"):
            w = _unpermute(w, cfg.n_heads if part == "attn_q" else cfg.kv_heads)
        state[hf_name(t.name)] = torch.from_numpy(np.ascontiguousarray(w)).to(target)
        check_finite({t.name: state[hf_name(t.name)]}, where)  # as stored, or overflowed in `target`
    model = build_from_state(cfg, from_hf_state(arch, cfg, state, where), dtype=target, source=where)
    tok, no_tokenizer = None, None
    try:
        tok = HFTokenizer(tokenizer_from_gguf(meta, where))
        if tok.vocab_size > cfg.vocab_size:
            tok, no_tokenizer = None, f"its {tok.vocab_size} tokens exceed the model's {cfg.vocab_size} embeddings"
    except DataError as e:
        no_tokenizer = str(e)
    with atomic_dir(out) as tmp:
        mark_output_dir(tmp, "import gguf")
        save_model(model, tmp, metadata={"imported_from": f"gguf:{meta['general.architecture']}"})
        if tok is not None:
            tok.save(tmp / TOKENIZER_DIR)
    return meta["general.architecture"], no_tokenizer
