"""The decoder-only transformer: config, presets, layers, KV cache, sizing and weight files."""

from groundup.model.config import ModelConfig
from groundup.model.kv_cache import KVCache
from groundup.model.presets import PRESETS
from groundup.model.transformer import Transformer

__all__ = ["KVCache", "ModelConfig", "PRESETS", "Transformer"]
