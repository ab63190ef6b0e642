"""Map Hugging Face tensor names onto our (possibly sharded, fused) parameters, per family.

The names are the models' own concern (loading/ only opens files and hands tensors over),
so they live here, beside the modules whose parameters they fill.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from torch import nn

from eaglet.errors import EagletError
from eaglet.models.layers import TensorSource

Getter = Callable[[str], TensorSource]


def _getter(tensors: dict[str, TensorSource]) -> Getter:
    def get(name: str) -> TensorSource:
        if name not in tensors:
            raise EagletError(f"the checkpoint lacks the tensor '{name}'")
        return tensors[name]

    return get


def _assign_ends(model: nn.Module, get: Getter) -> None:
    """Embedding, final norm and LM head: named alike in every family."""
    model.embed.load(get("model.embed_tokens.weight"))
    model.norm.load(get("model.norm.weight"))
    if not model.cfg.tie_word_embeddings:
        model.lm_head.load(get("lm_head.weight"))


def _assign_mlp(mlp: nn.Module, get: Getter, p: str) -> None:
    """gate/up/down of an MLP named ``{p}gate_proj.weight`` and so on."""
    mlp.gate_up.load(0, get(p + "gate_proj.weight"))
    mlp.gate_up.load(1, get(p + "up_proj.weight"))
    mlp.down.load(get(p + "down_proj.weight"))


def _layers(model: nn.Module, tensors: dict[str, TensorSource]) -> Iterator[tuple[int, nn.Module, str, Getter]]:
    """Load what every family names alike (embedding, final norm, LM head, each layer's two norms),
    then yield (index, layer, its name prefix, getter) for the family's own tensors."""
    get = _getter(tensors)
    _assign_ends(model, get)
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        layer.input_norm.load(get(p + "input_layernorm.weight"))
        layer.post_norm.load(get(p + "post_attention_layernorm.weight"))
        yield i, layer, p, get


def assign(model: nn.Module, tensors: dict[str, TensorSource]) -> None:
    """Load every tensor the model needs; a missing one is an error naming it."""
    cfg = model.cfg
    for _, layer, p, get in _layers(model, tensors):
        attn = layer.attn
        for part in ("q", "k", "v"):
            attn.qkv.load(part, get(f"{p}self_attn.{part}_proj.weight"))
            if cfg.attention_bias:
                attn.qkv.load(part, get(f"{p}self_attn.{part}_proj.bias"), bias=True)
        attn.o.load(get(p + "self_attn.o_proj.weight"))
        if cfg.qk_norm:
            attn.q_norm.load(get(p + "self_attn.q_norm.weight"))
            attn.k_norm.load(get(p + "self_attn.k_norm.weight"))
        _assign_mlp(layer.mlp, get, p + "mlp.")


def assign_deepseek(model: nn.Module, tensors: dict[str, TensorSource]) -> None:
    """The DeepSeek-V3 names (``self_attn.q_a_proj``, ``mlp.experts.{e}.gate_proj``...); extra
    tensors (the multi-token-prediction layer 61 of DeepSeek-V3) are not read."""
    scales = [n for n in tensors if n.endswith("weight_scale_inv")]
    if scales:
        raise EagletError(f"the checkpoint holds FP8 block scales ({scales[0]}, ...); eaglet loads "
                          "bfloat16/float16/float32 weights: dequantise it first (DeepSeek ships fp8_cast_bf16.py)")
    cfg = model.cfg
    for i, layer, p, get in _layers(model, tensors):
        attn, a = layer.attn, p + "self_attn."
        if attn.q_a is not None:
            attn.q_a.load(get(a + "q_a_proj.weight"))
            attn.q_a_norm.load(get(a + "q_a_layernorm.weight"))
            attn.q_b.load(get(a + "q_b_proj.weight"))
        else:
            attn.q_b.load(get(a + "q_proj.weight"))
        attn.kv_a.load(get(a + "kv_a_proj_with_mqa.weight"))
        attn.kv_a_norm.load(get(a + "kv_a_layernorm.weight"))
        attn.kv_b.load(get(a + "kv_b_proj.weight"))
        attn.o.load(get(a + "o_proj.weight"))
        if cfg.rope_interleave:
            attn.deinterleave_rope()
        if i not in cfg.moe_layers:
            _assign_mlp(layer.mlp, get, p + "mlp.")
            continue
        moe, m = layer.mlp, p + "mlp."
        moe.router.load(get(m + "gate.weight"), get(m + "gate.e_score_correction_bias"))
        for e in range(cfg.n_routed_experts):
            x = f"{m}experts.{e}."
            moe.experts.load(e, get(x + "gate_proj.weight"), get(x + "up_proj.weight"), get(x + "down_proj.weight"))
        if moe.shared is not None:
            _assign_mlp(moe.shared, get, m + "shared_experts.")
