"""Map Hugging Face tensor names onto our (possibly sharded, fused) parameters."""

from __future__ import annotations

import re

from torch import nn

from eaglet.errors import EagletError
from eaglet.models.layers import TensorSource

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def assign(model: nn.Module, tensors: dict[str, TensorSource]) -> None:
    """Load every tensor the model needs; a missing one is an error naming it."""
    cfg = model.cfg

    def get(name: str) -> TensorSource:
        if name not in tensors:
            raise EagletError(f"the checkpoint lacks the tensor '{name}'")
        return tensors[name]

    model.embed.load(get("model.embed_tokens.weight"))
    model.norm.load(get("model.norm.weight"))
    if not cfg.tie_word_embeddings:
        model.lm_head.load(get("lm_head.weight"))
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        layer.input_norm.load(get(p + "input_layernorm.weight"))
        layer.post_norm.load(get(p + "post_attention_layernorm.weight"))
        attn = layer.attn
        for part in ("q", "k", "v"):
            attn.qkv.load(part, get(f"{p}self_attn.{part}_proj.weight"))
            if cfg.attention_bias:
                attn.qkv.load(part, get(f"{p}self_attn.{part}_proj.bias"), bias=True)
        attn.o.load(get(p + "self_attn.o_proj.weight"))
        if cfg.qk_norm:
            attn.q_norm.load(get(p + "self_attn.q_norm.weight"))
            attn.k_norm.load(get(p + "self_attn.k_norm.weight"))
        layer.mlp.gate_up.load(0, get(p + "mlp.gate_proj.weight"))
        layer.mlp.gate_up.load(1, get(p + "mlp.up_proj.weight"))
        layer.mlp.down.load(get(p + "mlp.down_proj.weight"))
