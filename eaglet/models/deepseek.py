"""The DeepSeek-V3 / Kimi-K2 target (MLA + MoE) as a plain nn.Module, with the Llama target's interface.

Only the layers, the rotary table (YaRN) and the cache (latent, see mla.py) differ from
llama.py: ``forward`` (explicit positions, slots and mask; capture points in the one
convention), ``logits`` and ``head_rows`` are the Llama Transformer's own code, so the
engine, generate, capture and the doctor drive this model unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from eaglet.kv_cache import AttnMeta
from eaglet.models.deepseek_config import DeepseekConfig
from eaglet.models.layers import MLP, RMSNorm, Rotary, TensorSource
from eaglet.models.llama import Transformer
from eaglet.models.mla import LatentAttention, LatentCache
from eaglet.models.moe import MoE
from eaglet.parallel.state import TPGroup


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DeepseekConfig, layer: int, tp: TPGroup):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = LatentAttention(cfg, layer, tp)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg, tp) if layer in cfg.moe_layers else MLP(cfg, tp)

    def forward(self, h, delta, cos, sin, meta, cache):
        """The pair protocol of ``llama.DecoderLayer.forward``: the previous MLP's output is added first."""
        # Each residual add follows its all-reduce (inside o, and the MoE's single reduce of
        # routed + shared experts), so ``h + delta``, the next capture point, is the complete
        # residual stream on every rank.
        h = h + delta
        h = h + self.attn(self.input_norm(h), cos, sin, meta, cache)
        return h, self.mlp(self.post_norm(h))


class DeepseekTransformer(Transformer):
    layer_class = DecoderLayer

    @staticmethod
    def rotary_table(cfg: DeepseekConfig, max_pos: int) -> Rotary:
        inv_freq, scale = cfg.rope_tables()
        return Rotary(None, max_pos, inv_freq, scale)  # [P, qk_rope_head_dim], YaRN's factor on cos/sin

    def attends_densely(self, ids: torch.Tensor, meta: AttnMeta) -> bool:
        return True  # latent attention reads the dense mask on every device

    def new_cache(self, batch: int, capacity: int) -> LatentCache:
        p, c = self.embed.weight, self.cfg
        return LatentCache(c.num_layers, batch, capacity, c.kv_lora_rank, c.qk_rope_head_dim, p.dtype, p.device)

    def load_weights(self, tensors: dict[str, TensorSource]) -> None:
        from eaglet.models.names import assign_deepseek

        assign_deepseek(self, tensors)

    @property
    def n_kv_local(self) -> int:
        return 1  # one latent row per slot, shared by every head

