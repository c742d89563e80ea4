"""Named model configurations users cite. Each is a set of ModelConfig overrides.

Parameter counts (from `groundup model info NAME`; tested in tests/test_model_sizing.py):

    tiny               0.36M  tests and the demo's smallest run
    gpt2-124m          124M   GPT-2 small class: LayerNorm, GELU, biases, tied (RoPE, not learned positions)
    ladder-100m        95.7M  16 x 640, GQA 10/5 heads, tied, vocab 32K
    ladder-350m        350M   24 x 1024, GQA 16/8, untied
    ladder-1b          1.01B  20 x 2048, GQA 16/8 (head dim 128), FFN 5632, tied
    ladder-7b          7.05B  32 x 4096, GQA 32/8, FFN 13824, untied: Llama-2-7B's shape with Llama-3's GQA
    llama3-8b          8.03B  Meta Llama 3 8B
    clover-12b         12.09B 40 x 5120, GQA 32/8 (head dim 160), FFN 14336, context 8192, vocab 64K,
                              untied. By hand: 40 layers x 285.7M (q and o 5120x5120, k and v
                              5120x1280, SwiGLU 3 x 5120 x 14336, two norms) + 2 x 64000 x 5120.
    deepseek-v2-lite   15.7B total, 2.66B active: MLA + 64 routed experts (6 active) + 2 shared

The ladder keeps the Llama recipe (pre-norm RMSNorm, SwiGLU, RoPE, GQA with 2:1 or 4:1 sharing,
head dim 64..128) and scales width and depth together, so a recipe found at 100M transfers.
"""

from __future__ import annotations

PRESETS: dict[str, dict] = {
    "tiny": dict(
        vocab_size=4096, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192, max_seq_len=256,
        tie_embeddings=True,
    ),
    "gpt2-124m": dict(
        vocab_size=50304, d_model=768, n_layers=12, n_heads=12, max_seq_len=1024, mlp="gelu", norm="layernorm",
        bias=True, tie_embeddings=True,
    ),
    "ladder-100m": dict(
        vocab_size=32768, d_model=640, n_layers=16, n_heads=10, n_kv_heads=5, max_seq_len=2048,
        tie_embeddings=True,
    ),
    "ladder-350m": dict(
        vocab_size=32768, d_model=1024, n_layers=24, n_heads=16, n_kv_heads=8, max_seq_len=2048,
    ),
    "ladder-1b": dict(
        vocab_size=32768, d_model=2048, n_layers=20, n_heads=16, n_kv_heads=8, d_ff=5632, max_seq_len=4096,
        rope_theta=500000.0, tie_embeddings=True,
    ),
    "ladder-7b": dict(
        vocab_size=32768, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=13824, max_seq_len=4096,
        rope_theta=500000.0,
    ),
    "llama3-8b": dict(
        vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336, max_seq_len=8192,
        rope_theta=500000.0, norm_eps=1e-5,
    ),
    "clover-12b": dict(
        vocab_size=64000, d_model=5120, n_layers=40, n_heads=32, n_kv_heads=8, d_ff=14336, max_seq_len=8192,
        rope_theta=500000.0, norm_eps=1e-5,
    ),
    "deepseek-v2-lite": dict(
        vocab_size=102400, d_model=2048, n_layers=27, n_heads=16, max_seq_len=32768, attention="mla",
        q_lora_rank=0, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        d_ff=10944, n_experts=64, moe_top_k=6, n_shared_experts=2, moe_d_ff=1408, n_dense_layers=1,
        moe_norm_topk=False, norm_eps=1e-6,
    ),
}
