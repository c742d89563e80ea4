"""The FLOPs one training step does per token, counted from the model as it trains.

    flops = step_flops(model, seq_len, checkpointing)   # StepFlops: forward, backward, recompute
    mfu = tokens/s * flops.model / peak;   hfu = tokens/s * flops.hardware / peak

The walk follows the forward pass and asks, at each matmul of a (d_in x d_out) weight, what autograd
will do with it (per token; a routed expert's matmuls for top_k of the tokens each):
    forward            2 d_in d_out
    input gradient     2 d_in d_out   only when the input requires grad: a trainable weight lies below it.
                                      Nothing below the lowest trainable weight has a backward at all
                                      (LoRA: not the first projection's input; frozen lower layers: none)
    weight gradient    2 d_in d_out   only for a weight that trains (LoRA: the adapters', not the base's)
Attention's score and value products, per token, layer and query head, over T keys (full T, as the
PaLM convention counts them): forward 2 T (d_qk + d_v); backward 2 T d_qk for dQ and for dK, 2 T d_v
for dP (when Q or K needs a gradient) and for dV.
With every weight trainable this is 6 N + 6 L H (d_qk + d_v) T, model/sizing.py's `flops_per_token`
(which also counts the norms' weights as matmul parameters).

Activation checkpointing reruns a block's forward inside its backward (blocks whose backward runs):
`recompute`, which HFU counts and MFU does not. torch stops a rerun once it has the last tensor the
backward saved (`set_checkpoint_early_stop`, on by default): a pre-norm block's final projection saves
its input before it runs and nothing after it saves anything, so that one matmul is not rerun.

tests/test_mfu.py checks this count against torch's FlopCounterMode on real steps. Left out, so MFU can
only be understated: element-wise work (norms, softmax, activations), the value head (one row per
sequence), and the B @ A products of adapters on stacked experts (recomputed at each expert's use).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.nn.utils import parametrize
from torch.utils import checkpoint as torch_checkpoint

from groundup.model.attention import Attention
from groundup.model.lora import LoRALinear
from groundup.model.mla import MLAttention
from groundup.model.moe import MoE
from groundup.model.sizing import attention_dims
from groundup.model.transformer import Block, Transformer


@dataclass(frozen=True)
class StepFlops:
    forward: float  # per token
    backward: float  # per token: the input and weight gradients autograd computes
    recompute: float  # per token: forward work rerun by activation checkpointing

    @property
    def model(self) -> float:
        """What MFU counts: the forward and backward the step needs."""
        return self.forward + self.backward

    @property
    def hardware(self) -> float:
        """What HFU counts: also the recomputed forward."""
        return self.model + self.recompute


def step_flops(model: Transformer, seq_len: int, checkpointing: bool = False) -> StepFlops:
    """FLOPs per token of one training step of `model` (its parameters' requires_grad as they train)
    on rows of `seq_len` tokens; `checkpointing`: block activations recomputed in backward."""
    walk = _Walk(model.cfg, seq_len)
    grad = _trains(model.embed)
    recompute = 0.0
    early_stop = getattr(torch_checkpoint, "_enable_checkpoint_early_stop", None) is not False
    for block in model.blocks:
        before = walk.forward
        grad = walk.block(block, grad)
        if checkpointing and grad:  # its backward runs, so its forward runs again
            recompute += walk.forward - before - (walk.last if early_stop and _ends_in_matmul(block) else 0.0)
    if model.norm is not None:
        grad = grad or _trains(model.norm)
    out = model.lm_head if model.lm_head is not None else model.embed
    walk.matmul(model.cfg.d_model, model.cfg.vocab_size, grad, _param_trains(out, "weight"))
    return StepFlops(walk.forward, walk.backward, recompute)


def _ends_in_matmul(b: Block) -> bool:
    """Whether nothing after the block's last matmul saves a tensor for backward: a pre-norm block without
    dropout whose MLP ends in a projection (a dense MLP, or an MoE's shared experts without the
    balancing loss, whose statistics come after them)."""
    if b.placement != "pre" or isinstance(b.dropout, nn.Dropout):
        return False
    mlp = b.mlp
    return not isinstance(mlp, MoE) or (mlp.shared is not None and not mlp.aux_loss_coef)


def _trains(module: nn.Module | None) -> bool:
    return module is not None and any(p.requires_grad for p in module.parameters())


def _param_trains(module: nn.Module, name: str) -> bool:
    """Whether `module.name` takes a gradient: its own parameter, or (an adapter on stacked experts) a
    parametrization's."""
    if parametrize.is_parametrized(module, name):
        return _trains(module.parametrizations[name])
    p = module._parameters.get(name)
    return p is not None and p.requires_grad


class _Walk:
    """The forward pass in order; each method takes whether its input requires grad and returns
    whether its output does."""

    def __init__(self, cfg, seq_len: int):
        self.cfg, self.seq_len = cfg, seq_len
        self.forward = self.backward = 0.0
        self.last = 0.0  # the forward FLOPs of the latest matmul

    def matmul(self, d_in: int, d_out: int, grad_in: bool, weight_trains: bool, share: float = 1.0) -> bool:
        f = 2.0 * d_in * d_out * share
        self.forward += f
        self.last = f
        self.backward += f * (grad_in + weight_trains)
        return grad_in or weight_trains

    def linear(self, m: nn.Module, grad: bool) -> bool:
        if isinstance(m, LoRALinear):
            out = self.linear(m.base, grad)
            if m.merged or m.disabled:
                return out
            width = m.rank * len(m.parts)  # a fused projection's parts each have their own A rows
            u = self.matmul(m.in_features, width, grad, m.lora_A.requires_grad)
            # B is block-diagonal over the parts: rank -> each part's outputs, out_features in all
            return self.matmul(m.rank, m.out_features, u, m.lora_B.requires_grad) or out
        if not hasattr(m, "in_features"):  # a projection split into parts that read the same input (tensor parallel)
            return any([self.linear(part, grad) for part in m.children()])
        trains = self.matmul(m.in_features, m.out_features, grad, _param_trains(m, "weight"))
        return trains or _trains(m)  # a trainable bias makes the output require grad too

    def products(self, grad_q: bool, grad_k: bool, grad_v: bool) -> bool:
        """Scores and values of every query head against T keys."""
        d_qk, d_v = attention_dims(self.cfg)
        per = 2.0 * self.cfg.n_heads * self.seq_len
        self.forward += per * (d_qk + d_v)
        self.backward += per * (d_qk * (grad_q + grad_k) + d_v * ((grad_q or grad_k) + grad_v))
        return grad_q or grad_k or grad_v

    def attention(self, attn: nn.Module, grad: bool) -> bool:
        if isinstance(attn, MLAttention):
            if hasattr(attn, "q_proj"):
                q = self.linear(attn.q_proj, grad)
            else:
                q = self.linear(attn.q_up, self.linear(attn.q_down, grad) or _trains(attn.q_norm))
            latent = self.linear(attn.kv_down, grad)  # c_kv and the shared RoPE key
            kv = self.linear(attn.kv_up, latent or _trains(attn.kv_norm))
            return self.linear(attn.o_proj, self.products(q, kv or latent, kv))
        if not isinstance(attn, Attention):
            raise TypeError(f"no FLOPs count for attention of type {type(attn).__name__}")
        qkv = self.linear(attn.qkv_proj, grad)
        y = self.products(qkv or _trains(attn.q_norm), qkv or _trains(attn.k_norm), qkv)
        return self.linear(attn.o_proj, y)

    def mlp(self, mlp: nn.Module, grad: bool) -> bool:
        if isinstance(mlp, MoE):
            cfg = self.cfg
            routed = self.linear(mlp.router, grad)  # the gate weights scale each expert's output
            width = (2 if mlp.gated else 1) * cfg.expert_ffn_dim
            h = self.matmul(cfg.d_model, width, grad, _param_trains(mlp, "experts_in"), mlp.top_k)
            out = self.matmul(cfg.expert_ffn_dim, cfg.d_model, h, _param_trains(mlp, "experts_out"), mlp.top_k)
            shared = self.mlp(mlp.shared, grad) if mlp.shared is not None else False
            return routed or out or shared
        first = mlp.gate_up_proj if hasattr(mlp, "gate_up_proj") else mlp.up_proj
        return self.linear(mlp.down_proj, self.linear(first, grad))

    def block(self, b: Block, grad: bool) -> bool:
        sandwich = b.placement == "sandwich"
        if b.placement == "post":  # x -> attention -> add -> norm -> MLP -> add -> norm
            a = self.attention(b.attn, grad)
            grad = grad or a or _trains(b.attn_norm)
            m = self.mlp(b.mlp, grad)
            return grad or m or _trains(b.mlp_norm)
        a = self.attention(b.attn, grad or _trains(b.attn_norm))
        grad = grad or a or (sandwich and _trains(b.attn_post_norm))
        m = self.mlp(b.mlp, grad or _trains(b.mlp_norm))
        return grad or m or (sandwich and _trains(b.mlp_post_norm))
