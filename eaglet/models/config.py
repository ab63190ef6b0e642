"""ModelConfig: the one description of a Llama-family target, read from an HF config.json.

Covers Llama 2/3/3.1 (llama3 rope scaling), Mistral, Qwen2 (qkv bias), Qwen3 (qk-norm)
and SmolLM2 (a Llama). Anything else is refused by name, never approximated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from eaglet.errors import EagletError
from eaglet.models.deepseek_config import MODEL_TYPES as DEEPSEEK_TYPES
from eaglet.models.deepseek_config import DeepseekConfig

# model_type -> (attention bias on q/k/v, RMSNorm on q and k per head)
SUPPORTED = {
    "llama": (False, False),
    "mistral": (False, False),
    "qwen2": (True, False),
    "qwen3": (False, True),
}


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # llama3 scaling: (factor, low_freq_factor, high_freq_factor, original_max_position)
    rope_llama3: tuple[float, float, float, int] | None = None
    max_position_embeddings: int = 4096
    # Mistral's sliding window: eaglet attends fully, which is identical while the whole
    # sequence fits in the window, so the usable context is capped there (see context_window).
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED:
            raise EagletError(
                f"unsupported architecture '{self.model_type}': eaglet runs "
                f"{', '.join(sorted(SUPPORTED))}"
            )
        if self.num_heads % self.num_kv_heads:
            raise EagletError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "head_dim"):
            if getattr(self, name) <= 0:
                raise EagletError(f"model config has {name}={getattr(self, name)}; it must be positive")

    @classmethod
    def from_hf(cls, d: dict) -> ModelConfig:
        """Build from an HF config.json dict (transformers 4.x and 5.x spellings)."""
        model_type = d.get("model_type")
        if model_type is None:
            arch = (d.get("architectures") or ["<none>"])[0]
            raise EagletError(f"config.json has no model_type (architectures: {arch})")
        if model_type not in SUPPORTED:
            raise EagletError(f"unsupported architecture '{model_type}': eaglet runs "
                              f"{', '.join(sorted(SUPPORTED) + list(DEEPSEEK_TYPES))}")
        bias, qk_norm = SUPPORTED[model_type]
        # transformers gives qwen2 a q/k/v bias and mistral none whatever attention_bias says;
        # llama and qwen3 read it, and then o_proj has a bias too, which eaglet does not model.
        for key in ("attention_bias", "mlp_bias"):
            if d.get(key) and (key == "mlp_bias" or model_type in ("llama", "qwen3")):
                raise EagletError(f"{model_type} with {key}=true is not supported (no bias on o_proj or the MLP)")
        # transformers 5 moved rope_theta/rope_scaling into rope_parameters.
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        llama3 = None
        if rope_type == "llama3":
            llama3 = (
                float(rope["factor"]),
                float(rope["low_freq_factor"]),
                float(rope["high_freq_factor"]),
                int(rope["original_max_position_embeddings"]),
            )
        elif rope_type not in ("default", None):
            raise EagletError(f"unsupported rope scaling '{rope_type}' in config.json")
        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            eos = d.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            return cls(
                model_type=model_type,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                rope_llama3=llama3,
                max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
                sliding_window=int(d["sliding_window"]) if d.get("sliding_window") and
                d.get("use_sliding_window", True) else None,
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                attention_bias=bias,
                qk_norm=qk_norm,
                bos_token_id=d.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
        except KeyError as e:
            raise EagletError(f"config.json lacks the key {e.args[0]!r}") from None

    def to_hf(self) -> dict:
        """An HF config.json dict that transformers and other engines read."""
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[self.model_type]
        rope: dict = {"rope_theta": self.rope_theta, "rope_type": "default"}
        if self.rope_llama3:
            f, lo, hi, orig = self.rope_llama3
            rope = {"rope_theta": self.rope_theta, "rope_type": "llama3", "factor": f,
                    "low_freq_factor": lo, "high_freq_factor": hi,
                    "original_max_position_embeddings": orig}
        eos = list(self.eos_token_ids)
        return {
            "architectures": [arch],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "rope_scaling": rope if self.rope_llama3 else None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else eos,
        }

    def draft_shape(self) -> tuple[int, int, int, int]:
        """(intermediate, heads, kv heads, head dim) of an EAGLE-3 draft layer: one layer of this target."""
        return self.intermediate_size, self.num_heads, self.num_kv_heads, self.head_dim

    @property
    def context_window(self) -> int:
        """Longest sequence this runtime computes exactly."""
        return min(self.max_position_embeddings, self.sliding_window or self.max_position_embeddings)

    def replace(self, **kw) -> ModelConfig:
        return dataclasses.replace(self, **kw)


def target_config(d: dict) -> ModelConfig | DeepseekConfig:
    """The config of a target from its HF config.json dict: the DeepSeek-V3 family or a Llama-family one."""
    if d.get("model_type") in DEEPSEEK_TYPES:
        return DeepseekConfig.from_hf(d)
    return ModelConfig.from_hf(d)
