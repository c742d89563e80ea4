"""`groundup export gguf`: a groundup model as one llama.cpp GGUF file (f32, f16, q8_0 or q4_0).

    report = export_gguf("runs/tiny", "out/tiny-q8_0.gguf", "q8_0")   # GGUFExport(arch, type, pre, notes, ...)

The promise: llama.cpp computes what groundup computes, up to the type's rounding, or nothing is
written. `groundup import gguf` and transformers' GGUF loader read the file back (tests/test_gguf_export.py).

Architectures, chosen as `export hf` chooses (the GGUF names are llama.cpp's graphs):

    llama   pre-norm RMSNorm, RoPE (none, linear; static NTK as a larger base), MHA/GQA/MQA, SwiGLU,
            tied or untied output (tied: no output.weight, as llama.cpp expects); Q and K rows are
            permuted into llama.cpp's interleaved RoPE layout, exactly as its converter does
    qwen2   the same + biases on q, k and v only (`qkv_bias`); NEOX RoPE, nothing permuted
    qwen3   the same + QK-norm (`qk_norm`); NEOX RoPE, nothing permuted

Refused by name before anything is written: MoE, MLA, LayerNorm, post-norm or Gemma's sandwich norms,
embedding scaling, logit soft-capping, non-gated or GeGLU MLPs (these graphs compute SiLU-gated MLPs),
biases other than Qwen2's (llama.cpp's llama graph has optional biases but transformers' GGUF loader
drops them, so the file would mean two things), a reward model's value head.

Tensors: --type f32 writes every tensor in f32; f16 writes matrices in f16; q8_0 / q4_0 quantize
matrices with `gguf.quants.quantize` (blocks of 32; a matrix whose rows are not a multiple of 32 falls
back to f16, as llama.cpp's converter does). 1-D tensors (norms, biases) stay f32, as llama.cpp keeps
them. A model made by `groundup quantize` is dequantized exactly (f32 is lossless); a type that cannot
hold its integer weights exactly (re-rounding them into other blocks and f16 scales) is refused,
naming the layer.

Tokenizer (byte-level BPE only: groundup's, or a Hugging Face one such as an imported Llama 3, Qwen
or SmolLM): `tokenizer.ggml.model = "gpt2"`, tokens in byte-level spelling, merges, token types
(special tokens CONTROL, other added tokens USER_DEFINED, padding up to the model's vocabulary
`[PADn]` UNUSED, as llama.cpp's converter pads), bos/eos/eot/padding ids, `add_bos_token` and the
chat template. groundup puts <|end_of_text|> before every plain document (`prefix_ids`), so the
file names it as the BOS token with add_bos_token = true: llama.cpp and transformers then put the
same token first. (llama.cpp also puts it before a rendered chat, which begins with
<|begin_of_text|>: one token of document-boundary context groundup's own chat rendering lacks.)
`tokenizer.ggml.pre` names the split regex: see `pre_tokenizer`.

The file is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from groundup.config import ConfigError, did_you_mean
from groundup.errors import CheckpointError, DataError
from groundup.interop.gguf_import import _GLOBAL, _LAYER
from groundup.interop.gguf_tokenizer import GPT2, PRE_TOKENIZERS, SMOLLM
from groundup.interop.hf_weights import rules, to_hf_state
from groundup.layout import check_tokenizer_fits, claim_output_file, find_tokenizer_dir, resolve_model_dir
from groundup.model.config import ModelConfig
from groundup.quant.formats import dequantize_int4, dequantize_int8
from groundup.quant.load import load_model
from groundup.quant.modules import QuantWeight
from groundup.quant.quantized_dir import is_quantized, read_quant_spec
from groundup.tokenizer import load_tokenizer
from groundup.tokenizer.hf_format import PATTERN_NAMES, byte_to_unicode, split_pattern

TYPES = ("f32", "f16", "q8_0", "q4_0")
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5
GGUF_NAMES = {hf: gguf for gguf, hf in {**_GLOBAL, **_LAYER}.items()}  # transformers' module -> GGUF's
# tokenizer.ggml.pre names written, most specific first (the regexes are gguf_tokenizer's, llama.cpp's)
PRE_ORDER = ("llama-bpe", "dbrx", "qwen2", "gpt-4o", "tekken", "smollm", "gpt2")


@dataclass
class GGUFExport:
    path: Path
    arch: str
    type: str
    tensors: int
    pre: str
    notes: list[str] = field(default_factory=list)


def _gguf():
    try:
        import gguf
    except ImportError:
        raise CheckpointError("writing GGUF files needs the gguf package (pip install gguf)") from None
    return gguf


# ----------------------------------------------------------------------------- architecture


def gguf_architecture(cfg: ModelConfig) -> str:
    """llama, qwen2 or qwen3: the llama.cpp graph computing exactly what `cfg` does (ConfigError naming
    the feature otherwise)."""
    def refuse(key: str, why: str):
        raise ConfigError(f"cannot export {key} = {getattr(cfg, key)!r} to GGUF: {why}", key=key)

    graphs = "llama.cpp's llama, qwen2 and qwen3 graphs (what GGUF export writes)"
    if cfg.value_head:
        refuse("value_head", "a reward model is not a causal language model")
    if cfg.attention == "mla":
        refuse("attention", f"{graphs} have no multi-head latent attention")
    if cfg.n_experts:
        refuse("n_experts", "GGUF export writes dense models only")
    if cfg.norm != "rmsnorm":
        refuse("norm", f"{graphs} use RMSNorm")
    if cfg.norm_placement != "pre":
        refuse("norm_placement", f"{graphs} normalise before attention and the MLP only (sandwich norms are "
               "Gemma's graphs, which GGUF export does not write)")
    for key in ("embed_scale", "attn_logit_softcap", "final_logit_softcap"):
        if getattr(cfg, key):
            refuse(key, f"{graphs} neither scale embeddings nor soft-cap logits (Gemma does)")
    if cfg.mlp != "swiglu":
        refuse("mlp", f"{graphs} compute SiLU-gated (SwiGLU) MLPs only")
    if cfg.bias:
        refuse("bias", "only Qwen2's biases on q, k and v (qkv_bias) export: llama.cpp's llama graph reads "
               "optional biases but transformers' GGUF loader drops them, so the file would mean two things")
    if cfg.qk_norm and cfg.qkv_bias:
        refuse("qkv_bias", "qwen3 (the QK-norm graph) has no biases")
    if cfg.d_model % cfg.n_heads:
        refuse("n_heads", f"GGUF readers derive the head size from d_model ({cfg.d_model}) / n_heads")
    return "qwen3" if cfg.qk_norm else "qwen2" if cfg.qkv_bias else "llama"


def gguf_name(hf: str) -> str:
    """llama.cpp's name of a transformers tensor name (model.layers.3.self_attn.q_proj.weight -> blk.3.attn_q.weight)."""
    stem, suffix = hf.rsplit(".", 1)
    if stem in GGUF_NAMES:
        return f"{GGUF_NAMES[stem]}.{suffix}"
    _, _, layer, part = stem.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[part]}.{suffix}"


def permute_rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter `permute`: each head's rotate-half rows as interleaved RoPE pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def float_state(model) -> tuple[dict[str, torch.Tensor], set[str]]:
    """(every tensor in float32 under the float model's names, the names that were quantized)."""

    quant = {name: m for name, m in model.named_modules() if isinstance(m, QuantWeight)}
    state, quantized = {}, set()
    for key, value in model.state_dict().items():
        owner, _, leaf = key.rpartition(".")
        if owner in quant and leaf in ("qweight", "scales", "zeros"):
            continue
        state[key] = value.detach().float()
    for name, m in quant.items():
        w = (dequantize_int8(m.qweight, m.scales) if m.fmt == "int8"
             else dequantize_int4(m.qweight, m.scales, m.zeros, m.group_size))
        state[f"{name}.weight"] = w.float()
        quantized.add(f"{name}.weight")
    return state, quantized


# ----------------------------------------------------------------------------- tensors


def encode_tensor(w: np.ndarray, type_: str):
    """(data, GGML type) of a float32 array as `type_` stores it (1-D tensors stay f32)."""
    gguf = _gguf()
    Q = gguf.GGMLQuantizationType
    if w.ndim == 1 or type_ == "f32":
        return np.ascontiguousarray(w, dtype=np.float32), Q.F32
    if type_ == "f16" or w.shape[-1] % 32:
        return np.ascontiguousarray(w, dtype=np.float16), Q.F16
    qtype = Q.Q8_0 if type_ == "q8_0" else Q.Q4_0
    return gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), qtype), qtype


def decode_tensor(data: np.ndarray, qtype) -> np.ndarray:
    return np.asarray(_gguf().quants.dequantize(data, qtype), dtype=np.float32)


def gguf_tensors(model, arch: str, type_: str, spec=None) -> tuple[list[tuple[str, np.ndarray, object]], list[str]]:
    """[(GGUF name, data, GGML type)] of the whole model, and notes; a quantized layer the type cannot hold
    exactly is refused (ConfigError) before anything is written."""

    cfg = model.cfg
    state, quantized = float_state(model)
    hf = to_hf_state(arch, cfg, state)
    source = {}  # transformers name -> our name, for messages about quantized layers
    for r in rules(arch, cfg):
        for name in r.hf:
            source[name] = r.ours[0] if len(r.ours) == 1 else name
    out, notes, fallback = [], [], []
    for hf_name, tensor in hf.items():
        name, w = gguf_name(hf_name), tensor.numpy()
        part = name.split(".")[-2]
        if arch == "llama" and part in ("attn_q", "attn_k"):
            w = permute_rope_rows(w, cfg.n_heads if part == "attn_q" else cfg.kv_heads)
        data, qtype = encode_tensor(w, type_)
        if source.get(hf_name) in quantized and not np.array_equal(decode_tensor(data, qtype), w):
            how = spec.describe() if spec is not None else "quantized"
            why = ("f16 cannot hold its dequantized values exactly" if type_ == "f16" else
                   "its blocks of 32 values with their own f16 scale cannot hold the quantized weights exactly")
            raise ConfigError(f"cannot export {source[hf_name].removesuffix('.weight')} ({how}) as GGUF {type_}: "
                              f"{why} (they would be rounded a second time); use --type f32 (the dequantized "
                              "weights, exact), or export the full-precision model it was quantized from with "
                              f"--type {type_}", key="type")
        if w.ndim == 2 and type_ in ("q8_0", "q4_0") and w.shape[-1] % 32:
            fallback.append(name)
        out.append((name, data, qtype))
    if fallback:
        notes.append(f"{len(fallback)} matrices have rows not a multiple of 32 and are stored f16 "
                     f"({', '.join(fallback[:3])}{', ...' if len(fallback) > 3 else ''})")
    return out, notes


# ----------------------------------------------------------------------------- tokenizer


def _tokenizer_json(tok) -> dict:
    text = tok.to_json() if tok.backend == "groundup" else tok.files.tokenizer_json
    return json.loads(text)


def pre_tokenizer(tok, data: dict) -> tuple[str, str | None]:
    """(tokenizer.ggml.pre, a note when the name's regex is not exactly the tokenizer's).

    llama.cpp knows a fixed set of split regexes by name. groundup's "gpt4" pattern with digit groups of
    1-3 is llama-bpe's (Llama 3's) exactly, ignore_merges included; with single digits, qwen2's. The
    default "gpt4-fast" pattern drops GPT-4's `\\s+(?!\\S)`, and no llama.cpp pre-tokenizer does, so
    the file names GPT-4's regex for the same digit groups (llama-bpe; other digit group lengths have no
    name either and get llama-bpe's groups of 1-3): llama.cpp then splits a run of two or more spaces
    or tabs before a non-space as "   ", " return" where groundup keeps "    ", "return". Both are
    ordinary byte-level pieces, so every text still encodes; only such runs tokenize differently.
    """
    if tok.backend == "groundup":
        found = [(n, d) for n in PATTERN_NAMES for d in range(1, 10) if split_pattern(n, d) == tok.pattern]
        if not found:
            raise DataError(f"tokenizer split regex {tok.pattern!r} is none of groundup's patterns; llama.cpp "
                            "could not reproduce it")
        name, digits = found[0]
        exact = split_pattern("gpt4", digits).replace(r"\p{N}{1,1}", r"\p{N}")
        pre = "qwen2" if digits == 1 else "llama-bpe"
        differences = []
        if name != "gpt4":
            differences.append(f"the {name!r} split pattern keeps a run of 2+ spaces or tabs before a word whole, "
                               "which no llama.cpp pre-tokenizer does: llama.cpp gives its last space to the word "
                               "('    return' -> '   ', ' return')")
        if digits not in (1, 3):
            differences.append(f"numbers split in groups of up to {digits} digits here, of up to 3 in llama.cpp")
        if exact != PRE_TOKENIZERS[pre][0] and not differences:
            raise RuntimeError(f"pre-tokenizer table out of step for {pre}")  # a bug, not a user error
        note = (f"tokenizer.ggml.pre = {pre!r} is the nearest llama.cpp pre-tokenizer: " + "; ".join(differences)
                if differences else None)
        if pre == "qwen2":  # the regex is exact; Qwen2's own tokenizer (and groundup's GGUF import) add NFC
            note = "; ".join(filter(None, [note, "readers that NFC-normalize for 'qwen2' (Qwen2's tokenizer.json, "
                                                 "groundup's import gguf) differ on text that is not NFC"]))
        return pre, note
    pre_tok, normalizer = data.get("pre_tokenizer") or {}, data.get("normalizer")
    steps = pre_tok.get("pretokenizers", [pre_tok]) if pre_tok.get("type") == "Sequence" else [pre_tok]
    kinds = [s.get("type") for s in steps]
    split, nfc = None, normalizer is not None and normalizer.get("type") == "NFC"
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True) and not steps[0].get("add_prefix_space"):
        split = GPT2
    elif kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        split = SMOLLM
    elif kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True) \
            and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert"):
        split = (steps[0].get("pattern") or {}).get("Regex")
    names = [n for n in PRE_ORDER if PRE_TOKENIZERS[n][0] == split and split is not None]
    if not names or (normalizer is not None and not nfc):
        raise DataError(f"{tok.files.where}: its pre-tokenizer ({'+'.join(map(str, kinds))}"
                        f"{', normalizer ' + str(normalizer.get('type')) if normalizer else ''}) is none llama.cpp "
                        "names in tokenizer.ggml.pre; a wrong split regex would tokenize plausibly and wrongly")
    ignore = bool(data["model"].get("ignore_merges"))
    best = next((n for n in names if PRE_TOKENIZERS[n][1] == ignore), names[0])
    return best, None


def tokenizer_fields(tok, n_vocab: int) -> tuple[dict, list[str]]:
    """The tokenizer.* metadata of a byte-level BPE tokenizer padded to `n_vocab` ids, and notes."""

    data = _tokenizer_json(tok)
    model, where = data["model"], getattr(getattr(tok, "files", None), "where", "tokenizer")
    decoder = data.get("decoder") or {}
    byte_level = any(d.get("type") == "ByteLevel" for d in [decoder, *decoder.get("decoders", [])])
    if model.get("type", "BPE") != "BPE" or model.get("byte_fallback") or not byte_level:
        raise DataError(f"{where}: GGUF export writes byte-level BPE tokenizers (tokenizer.ggml.model 'gpt2'); "
                        "this one is not (SentencePiece-style and Unigram vocabularies are not exported)")
    pre, note = pre_tokenizer(tok, data)
    tokens: list[str | None] = [None] * n_vocab
    types = [UNUSED] * n_vocab
    for text, i in model["vocab"].items():  # a padding token read back from a GGUF file stays UNUSED
        tokens[i], types[i] = text, UNUSED if text == f"[PAD{i}]" else NORMAL
    for added in data.get("added_tokens") or []:
        i = added["id"]
        tokens[i], types[i] = added["content"], CONTROL if added.get("special") else USER_DEFINED
    alphabet = set(byte_to_unicode().values())
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i] = f"[PAD{i}]"  # llama.cpp's converter fills unused ids so
        elif types[i] == NORMAL and not set(t) <= alphabet:
            raise DataError(f"{where}: token {i} ({t!r}) is not spelled in the byte-level alphabet")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    prefix = tok.prefix_ids
    if len(prefix) > 1:
        raise DataError(f"{where}: its post-processor puts {len(prefix)} tokens before a text; GGUF has one BOS")
    bos = prefix[0] if prefix else tok.bos_id
    fields = {"model": "gpt2", "pre": pre, "tokens": tokens, "types": types, "merges": merges,
              "bos": bos, "eos": tok.eot_id, "pad": tok.pad_id, "add_bos": bool(prefix),
              "eot": tok.end_of_turn_id if tok.end_of_turn_id not in (None, tok.eot_id) else None,
              "template": tok.chat_template if isinstance(tok.chat_template, str) else None}
    return fields, [note] if note else []


# ----------------------------------------------------------------------------- the file


def _write(path: Path, arch: str, cfg: ModelConfig, type_: str, tokenizer: dict, tensors: list) -> None:
    gguf = _gguf()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(cfg.name)
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[type_])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.ffn_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.kv_heads)
    w.add_key_length(cfg.attn_head_dim)
    w.add_value_length(cfg.attn_head_dim)
    w.add_rope_dimension_count(cfg.attn_head_dim)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    d = cfg.attn_head_dim
    theta = cfg.rope_theta * cfg.rope_scaling_factor ** (d / (d - 2)) if cfg.rope_scaling == "ntk" else cfg.rope_theta
    w.add_rope_freq_base(theta)  # static NTK scaling is exactly a larger base
    if cfg.rope_scaling == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(cfg.rope_scaling_factor)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model(tokenizer["model"])
    w.add_tokenizer_pre(tokenizer["pre"])
    w.add_token_list(tokenizer["tokens"])
    w.add_token_types(tokenizer["types"])
    w.add_token_merges(tokenizer["merges"])
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("eot", w.add_eot_token_id),
                     ("pad", w.add_pad_token_id), ("template", w.add_chat_template)):
        if tokenizer[key] is not None:
            add(tokenizer[key])
    w.add_add_bos_token(tokenizer["add_bos"])
    w.add_add_eos_token(False)
    for name, data, qtype in tensors:
        w.add_tensor(name, data, raw_dtype=None if qtype.name in ("F32", "F16") else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def export_gguf(checkpoint: str | Path, out: str | Path, type_: str | None = None,
                overwrite: bool = False) -> GGUFExport:
    """Write OUT (a .gguf file); `type_` default: f16, or f32 for a quantized model (its exact form)."""

    _gguf()
    model_dir = resolve_model_dir(checkpoint)
    quantized = is_quantized(model_dir)
    type_ = type_ or ("f32" if quantized else "f16")
    if type_ not in TYPES:
        raise ConfigError(f"--type {type_!r}: expected one of {', '.join(TYPES)}{did_you_mean(type_, TYPES)}",
                          key="type")
    out = claim_output_file(out, "export gguf", ".gguf file")
    if out.exists() and (not overwrite or Path(model_dir).resolve() in out.resolve().parents):
        raise DataError(f"{out}: exists; " + ("it is a file of the model being exported: choose another --out"
                                              if overwrite else "pass --overwrite to replace it"))
    tok_dir = find_tokenizer_dir(model_dir)
    if tok_dir is None:
        raise CheckpointError(f"{model_dir}: no tokenizer beside the checkpoint (MODEL/tokenizer or RUN/tokenizer); "
                              "a GGUF file carries its tokenizer")
    tok = load_tokenizer(tok_dir)
    model = load_model(model_dir)
    check_tokenizer_fits(tok.vocab_size, model.cfg.vocab_size, tok_dir, model_dir)
    arch = gguf_architecture(model.cfg)
    tokenizer, notes = tokenizer_fields(tok, model.cfg.vocab_size)
    tensors, more = gguf_tensors(model, arch, type_, read_quant_spec(model_dir) if quantized else None)
    notes += more
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        _write(tmp, arch, model.cfg, type_, tokenizer, tensors)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return GGUFExport(out, arch, type_, len(tensors), tokenizer["pre"], notes)
