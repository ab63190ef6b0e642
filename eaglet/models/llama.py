"""The Llama-family target (Llama 2/3/3.1, Mistral, Qwen2, Qwen3, SmolLM2) as a plain nn.Module.

``forward`` takes explicit positions, cache slots and an attention mask (see
kv_cache.py), and returns the final-normed hidden states plus, when asked, the
residual-stream points of a CaptureSpec concatenated in spec order. Logits are a
separate call so callers project only the positions they need.
"""

from __future__ import annotations

import torch
from torch import nn

from eaglet.kv_cache import AttnMeta, KVCache, LayerKV
from eaglet.models.attention import attention, cached_attention, kernel_applies
from eaglet.models.config import ModelConfig
from eaglet.models.layers import (
    MLP,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    Rotary,
    RowParallelLinear,
    TensorSource,
    VocabParallelEmbedding,
    apply_rotary,
)
from eaglet.parallel.state import SINGLE, TPGroup


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, tp: TPGroup):
        super().__init__()
        self.layer = layer
        self.qkv = QKVParallelLinear(cfg, tp)
        self.n_q, self.n_kv, self.d = self.qkv.n_q, self.qkv.n_kv, cfg.head_dim
        self.o = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, tp)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttnMeta | None, kv: LayerKV | None) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split([self.n_q * self.d, self.n_kv * self.d, self.n_kv * self.d], dim=-1)
        q = q.view(b, t, self.n_q, self.d)  # [B, T, nq, D]
        k = k.view(b, t, self.n_kv, self.d)  # [B, T, nkv, D]
        v = v.view(b, t, self.n_kv, self.d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if kv is None:
            # Whole sequences (training, feature capture): plain causal attention.
            mask = meta.mask if meta is not None else None
            out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask,
                            causal=meta is None).transpose(1, 2)  # [B, T, nq, D]
        else:
            kv.write(k, v, meta.slots)
            out = cached_attention(q, kv, meta)  # [B, T, nq, D]
        return self.o(out.reshape(b, t, self.n_q * self.d))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, tp: TPGroup):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer, tp)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, tp)

    def forward(self, h, delta, cos, sin, meta: AttnMeta | None, cache: KVCache | None):
        return self.block(h, delta, cos, sin, meta, cache.layer(self.attn.layer) if cache is not None else None)

    # Traced once and reused by every layer: its inputs are tensors, modules and pytrees of them (the cache's
    # layer as ``LayerKV``, not the cache and a layer number, which differs between layers); with the cache itself
    # torch 2.13 traced and compiled each layer (~1.2 s a layer of a prefill's compile on the 2-core CPU;
    # scripts/layer_compile.py, session 43). A no-op without compile.
    @torch.compiler.nested_compile_region
    def block(self, h, delta, cos, sin, meta, kv):
        """(residual stream before the previous layer's MLP [B, T, H], that MLP's output [B, T, H]) -> the
        same pair for this layer. The MLP's output is added here, where the add fuses with this layer's
        first norm: the compiled region is a fusion boundary, so added at the end of the layer it was
        a kernel of its own in every layer (``Transformer.forward`` adds the last one)."""
        # Residual adds happen after each all-reduce (inside o/down), so ``h + delta`` is always
        # the complete residual stream on every rank: the capture contract relies on it.
        # If a fused or deferred all-reduce is ever introduced, capture must move after it.
        h = h + delta
        h = h + self.attn(self.input_norm(h), cos, sin, meta, kv)
        return h, self.mlp(self.post_norm(h))


class Transformer(nn.Module):
    layer_class = DecoderLayer  # another family's target subclasses this with its own layers and rotary table

    def __init__(self, cfg: ModelConfig, tp: TPGroup = SINGLE, max_pos: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.tp = tp
        self.embed = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.layers = nn.ModuleList(self.layer_class(cfg, i, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp,
                                      self.embed if cfg.tie_word_embeddings else None)
        self.rotary = self.rotary_table(cfg, max_pos or cfg.max_position_embeddings)

    @staticmethod
    def rotary_table(cfg: ModelConfig, max_pos: int) -> Rotary:
        return Rotary(cfg, max_pos)

    @property
    def n_kv_local(self) -> int:
        return self.layers[0].attn.n_kv

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        p = self.embed.weight
        return KVCache(self.cfg.num_layers, batch, capacity, self.n_kv_local, self.cfg.head_dim, p.dtype, p.device)

    def forward(self, ids: torch.Tensor, meta: AttnMeta | None = None, cache: KVCache | None = None,
                capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids [B, T] -> (final-normed hidden [B, T, H], captured points [B, T, k*H] or None).

        Without ``meta`` the tokens are whole sequences at positions 0..T-1, causal.
        """
        if meta is None:
            positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        else:
            positions = meta.positions
        cos, sin = self.rotary(positions)
        if cache is not None and self.attends_densely(ids, meta):
            # Built once, here: built by the first layer inside the layers' compiled region (DecoderLayer) it
            # is a side effect torch.compile refuses, which kept SDPA's paths (the CPU, long prefills) eager.
            meta.dense_mask()
        h = self.embed(ids)  # [B, T, H]
        delta = torch.zeros_like(h)  # the MLP output each layer adds first (DecoderLayer.forward)
        points: dict[int, torch.Tensor] = {}
        for j, layer in enumerate(self.layers):
            if j in capture:
                points[j] = h + delta
            h, delta = layer(h, delta, cos, sin, meta, cache)
        h = h + delta
        if self.cfg.num_layers in capture:
            points[self.cfg.num_layers] = h
        aux = torch.cat([points[p] for p in capture], dim=-1) if capture else None
        return self.norm(h), aux

    def attends_densely(self, ids: torch.Tensor, meta: AttnMeta) -> bool:
        """Whether attention over the cache reads ``meta.dense_mask()`` (SDPA), not the Triton kernel nor SDPA's
        causal path of a prefill into empty rows (``from_empty``, read here first for the reason above)."""
        return not kernel_applies(ids.device, self.cfg.head_dim, meta) and not meta.from_empty()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(h)  # [..., V]

    def head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The LM head's rows for token ids [n] -> [n, H], whole under tensor parallelism too."""
        return self.lm_head.rows(ids)

    def load_weights(self, tensors: dict[str, TensorSource]) -> None:
        """Fill every parameter from HF-named checkpoint tensors (``model.layers.0...``); a missing one is an
        error naming it."""
        from eaglet.models.names import assign

        assign(self, tensors)
