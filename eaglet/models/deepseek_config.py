"""DeepseekConfig: a DeepSeek-V3 / Kimi-K2 target (MLA + MoE), read from an HF config.json.

DeepSeek-V3 (arXiv 2412.19437) and Kimi-K2 share one architecture, ``DeepseekV3ForCausalLM``:
multi-head latent attention (low-rank q and kv projections, a no-rope and a rope part per
head, YaRN rope scaling with an attention-scale correction) and mixture-of-experts layers
after ``first_k_dense_replace`` dense ones (sigmoid scores, a correction bias that only
steers the choice, group-limited top-k). The facts follow transformers' DeepseekV3.

The fields the rest of eaglet reads from a target config (vocab, hidden size, layers,
window, EOS, the draft's shape) have ModelConfig's names, so a Target holds either.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from eaglet.errors import EagletError

MODEL_TYPES = ("deepseek_v3", "kimi_k2")
ARCH = "DeepseekV3ForCausalLM"
DRAFT_HEAD_DIM = 128  # the draft's attention: Llama-style heads of 128 over the target's hidden size


@dataclass(frozen=True)
class Yarn:
    """YaRN rope scaling (arXiv 2309.00071) as DeepSeek configures it."""

    factor: float
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0  # 0: absent
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None  # multiplies cos/sin; derived from the mscales when None
    truncate: bool = True


def _mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


@dataclass(frozen=True)
class DeepseekConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the dense layers' MLP
    num_layers: int
    num_heads: int
    q_lora_rank: int | None  # None: q is one full-rank projection (DeepSeek-V2-Lite style)
    kv_lora_rank: int  # the latent each cache slot stores
    qk_nope_head_dim: int
    qk_rope_head_dim: int  # the rope key each cache slot stores (shared by all heads)
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    moe_intermediate_size: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    first_k_dense_replace: int
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    yarn: Yarn | None = None
    rope_interleave: bool = True  # checkpoint rope dims in (x0, x1) pairs; de-interleaved at load
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise EagletError(f"'{self.model_type}' is not a DeepSeek-V3 family model type ({', '.join(MODEL_TYPES)})")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "kv_lora_rank", "qk_rope_head_dim",
                     "v_head_dim"):
            if getattr(self, name) <= 0:
                raise EagletError(f"model config has {name}={getattr(self, name)}; it must be positive")
        if self.qk_rope_head_dim % 2:
            raise EagletError(f"qk_rope_head_dim={self.qk_rope_head_dim} must be even (rotary pairs)")
        if self.moe_layers:
            e, g = self.n_routed_experts, self.n_group
            if e % g or not 0 < self.topk_group <= g:
                raise EagletError(f"n_routed_experts={e}, n_group={g}, topk_group={self.topk_group}: experts must "
                                  "split evenly into groups and topk_group must be in 1..n_group")
            if e // g < 2 or not 0 < self.num_experts_per_tok <= self.topk_group * (e // g):
                raise EagletError(f"num_experts_per_tok={self.num_experts_per_tok} cannot be chosen from "
                                  f"{self.topk_group} groups of {e // g} experts (each group needs 2 or more)")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def moe_layers(self) -> range:
        """Indices of the MoE layers (the first ``first_k_dense_replace`` are dense)."""
        return range(self.first_k_dense_replace, self.num_layers) if self.n_routed_experts else range(0)

    @property
    def context_window(self) -> int:
        return self.max_position_embeddings

    @property
    def attention_scale(self) -> float:
        """Softmax scale: 1/sqrt(qk_head_dim), times mscale(factor, mscale_all_dim)^2 under YaRN."""
        scale = self.qk_head_dim ** -0.5
        if self.yarn is not None and self.yarn.mscale_all_dim:
            scale *= _mscale(self.yarn.factor, self.yarn.mscale_all_dim) ** 2
        return scale

    def rope_tables(self) -> tuple[torch.Tensor, float]:
        """(inverse frequencies [qk_rope_head_dim/2] in float32, the factor cos/sin are multiplied by)."""
        d, base = self.qk_rope_head_dim, self.rope_theta
        pos_freqs = base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        if self.yarn is None:
            return 1.0 / pos_freqs, 1.0
        y = self.yarn
        factor = y.attention_factor
        if factor is None:
            factor = _mscale(y.factor, y.mscale) / _mscale(y.factor, y.mscale_all_dim) \
                if y.mscale and y.mscale_all_dim else _mscale(y.factor)

        def dim_of(rotations: float) -> float:  # the dimension that turns ``rotations`` times in the original window
            return d * math.log(y.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = dim_of(y.beta_fast), dim_of(y.beta_slow)
        if y.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        high = high + 0.001 if low == high else high
        # Fast-turning dimensions keep their frequency (extrapolate), slow ones are divided by
        # the factor (interpolate), a linear ramp blends the band between.
        ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp
        inv = (1.0 / (y.factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep
        return inv, float(factor)

    def draft_shape(self) -> tuple[int, int, int, int]:
        """(intermediate, heads, kv heads, head dim) of an EAGLE-3 draft layer for this target:
        Llama-style heads of 128 over the hidden size, 8 KV heads where they divide (SpecForge's
        DeepSeek-V3 draft: 56 heads, 8 KV heads), and the dense layers' MLP width."""
        heads = max(1, self.hidden_size // DRAFT_HEAD_DIM)
        head_dim = self.hidden_size // heads
        return self.intermediate_size, heads, 8 if heads % 8 == 0 else heads, head_dim

    def replace(self, **kw) -> DeepseekConfig:
        return dataclasses.replace(self, **kw)

    @classmethod
    def from_hf(cls, d: dict) -> DeepseekConfig:
        """Build from an HF config.json dict (DeepSeek-V3's own and transformers' spellings)."""
        q = d.get("quantization_config")
        if q:
            block = f", weight_block_size {q['weight_block_size']}" if q.get("weight_block_size") else ""
            raise EagletError(f"this checkpoint is quantised ({q.get('quant_method', '?')}{block}); eaglet loads "
                              "bfloat16/float16/float32 weights: dequantise it first (DeepSeek ships fp8_cast_bf16.py)")
        for key, want in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc"), ("hidden_act", "silu"),
                          ("moe_layer_freq", 1)):
            if d.get(key, want) != want:
                raise EagletError(f"{d['model_type']} with {key}={d[key]!r} is not supported (eaglet runs {want!r})")
        if d.get("attention_bias"):
            raise EagletError(f"{d['model_type']} with attention_bias=true is not supported")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        yarn = None
        if rope_type == "yarn":
            yarn = Yarn(float(rope["factor"]), int(rope["original_max_position_embeddings"]),
                        float(rope.get("beta_fast") or 32), float(rope.get("beta_slow") or 1),
                        float(rope.get("mscale") or 0), float(rope.get("mscale_all_dim") or 0),
                        rope.get("attention_factor"), bool(rope.get("truncate", True)))
        elif rope_type not in ("default", None):
            raise EagletError(f"unsupported rope scaling '{rope_type}' for {d['model_type']} (default or yarn)")
        try:
            heads = int(d["num_attention_heads"])
            eos = d.get("eos_token_id")
            experts = int(d.get("n_routed_experts") or 0)
            return cls(
                model_type=d["model_type"], vocab_size=int(d["vocab_size"]), hidden_size=int(d["hidden_size"]),
                intermediate_size=int(d["intermediate_size"]), num_layers=int(d["num_hidden_layers"]),
                num_heads=heads, q_lora_rank=int(d["q_lora_rank"]) if d.get("q_lora_rank") else None,
                kv_lora_rank=int(d["kv_lora_rank"]), qk_nope_head_dim=int(d["qk_nope_head_dim"]),
                qk_rope_head_dim=int(d["qk_rope_head_dim"]), v_head_dim=int(d["v_head_dim"]),
                n_routed_experts=experts, n_shared_experts=int(d.get("n_shared_experts") or 0),
                moe_intermediate_size=int(d.get("moe_intermediate_size") or 0),
                num_experts_per_tok=int(d.get("num_experts_per_tok") or 0),
                n_group=int(d.get("n_group") or 1), topk_group=int(d.get("topk_group") or 1),
                first_k_dense_replace=int(d.get("first_k_dense_replace") or 0),
                norm_topk_prob=bool(d.get("norm_topk_prob", True)),
                routed_scaling_factor=float(d.get("routed_scaling_factor") or 1.0),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10000.0))), yarn=yarn,
                rope_interleave=bool(d.get("rope_interleave", True)),
                max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                bos_token_id=d.get("bos_token_id"),
                eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),)),
            )
        except KeyError as e:
            raise EagletError(f"config.json lacks the key {e.args[0]!r}") from None
