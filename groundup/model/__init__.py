"""The decoder-only transformer: config, presets, layers, forward heads, KV cache, LoRA, sizing and model directories.
Float models only: quantized layers and the load site that picks either kind are groundup.quant.

    config.py          ModelConfig: every architectural choice, typed and validated
    presets.py         PRESETS: named configurations (tiny, gpt2-124m, the ladder, llama3-8b, deepseek-v2-lite, ...)
    transformer.py     Transformer and Block: embedding, blocks, final norm, then a head; segment positions
    attention.py       causal self-attention (MHA, GQA, MQA), masks and the attend paths
    mla.py             multi-head latent attention (DeepSeek-V2), with weight absorption when decoding
    rope.py            rotary position embeddings (rotate-half), linear and NTK scaling
    mlp.py             feed-forward layers: SwiGLU, GeGLU, GELU, squared ReLU
    moe.py             mixture of experts: top-k router, shared experts, aux-loss-free bias and the balancing loss
    norm.py            RMSNorm and LayerNorm behind make_norm
    kv_cache.py        KVCache: preallocated per-layer buffers for incremental decoding, left-padded rows
    heads.py           forward heads: Logits, NextTokenLoss, TokenLogprobs, TokenStatistics, RewardScore
    loss.py            cross-entropy + z-loss, and the fused chunked output-layer loss
    chunked_scores.py  log p(target) and token statistics a chunk of positions at a time, never the full logits
    logprobs.py        logprobs, token_stats, sequence_logprobs: the one scorer evaluation, DPO, GRPO and serve call
    lora.py            LoRA (and QLoRA) adapters: apply, save their state, load, disable, merge
    sizing.py          parameters, FLOPs per token, weight and KV-cache bytes, the fits-in-memory check
    model_dir.py       model directories: model.safetensors + model.toml, saved and loaded (float models)
    commands.py        `groundup model info`
"""

from groundup.model.config import ModelConfig
from groundup.model.kv_cache import KVCache
from groundup.model.presets import PRESETS
from groundup.model.transformer import Transformer

__all__ = ["KVCache", "ModelConfig", "PRESETS", "Transformer"]
