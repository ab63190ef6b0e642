"""Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434; DeepSeek-V3) over a latent cache.

A token's keys and values are up-projections of one compressed latent ``c`` [kv_lora_rank]
plus one rope key ``k_r`` [qk_rope_head_dim] that every head shares:

    k_h = [W_UK_h c ; k_r],   v_h = W_UV_h c        (W_UK_h, W_UV_h: head h's rows of kv_b_proj)

so the cache stores ``[c ; k_r]`` per slot (576 values a layer for DeepSeek-V3, against
2 x 128 heads x 128 for full K/V). Over the cache the up-projections are absorbed:

    q_h . k_h = (W_UK_h^T q_nope_h) . c + q_rope_h . k_r,    out_h = W_UV_h (sum_s p_s c_s)

every head scores the same [S, r + dr] entries (one shared KV head) and the cached latents
are never expanded. That is the cheap form when few queries meet many slots (decode, draft
trees, verification); for long query blocks (prefill, ``T > ABSORB_MAX_QUERIES``) and whole
sequences without a cache (training, capture) K/V are expanded per head instead, which costs
fewer FLOPs once T approaches S. Both are plain PyTorch on every device: the Triton tree
kernel (tree_attention.py) is written for separate K/V of head dim 64/128 and does not apply.
"""

from __future__ import annotations

import torch
from torch import nn

from eaglet.errors import EagletError
from eaglet.kv_cache import AttnMeta, KVCache
from eaglet.models.attention import sdpa
from eaglet.models.deepseek_config import DeepseekConfig
from eaglet.models.layers import ColumnParallelLinear, RMSNorm, RowParallelLinear, apply_rotary
from eaglet.parallel.state import SINGLE, TPGroup

ABSORB_MAX_QUERIES = 64  # query block sizes up to this attend in the absorbed (latent) form
LATENT_NORM_EPS = 1e-6  # q_a/kv_a layernorms use RMSNorm's default, not the config's eps (as the reference)


class LatentCache(KVCache):
    """A KVCache whose slot holds ``[latent ; rope key]`` once for all heads.

    Slots, ``lens``, metadata, ``commit`` (tree rollback) and row views are KVCache's own:
    they move whole slots, whatever a slot holds. ``k[layer]`` is [B, 1, capacity, r + dr];
    there is no separate V (values are the latent part).
    """

    def __init__(self, num_layers: int, batch: int, capacity: int, latent_dim: int, rope_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        # KVCache.__init__ is not called: it would allocate a V buffer this cache does not have.
        self.capacity = capacity
        self.latent_dim = latent_dim
        shape = (batch, 1, capacity, latent_dim + rope_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v: list[torch.Tensor] = []  # no V: the latent part of K serves as values
        self.lens = torch.zeros(batch, dtype=torch.long, device=device)  # [B] committed slots
        self._rows = torch.arange(batch, device=device).unsqueeze(1)  # [B, 1]

    def write(self, layer: int, latent: torch.Tensor, rope: torch.Tensor, slots: torch.Tensor) -> None:
        # latent [B, T, r], rope [B, T, dr]; slots [B, T]
        self.k[layer][self._rows, 0, slots] = torch.cat([latent, rope], dim=-1)

    def view(self, layer: int, n_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(entries [B, S, r + dr], their latent part [B, S, r]) of the first ``n_slots`` slots."""
        entries = self.k[layer][:, 0, :n_slots]
        return entries, entries[..., : self.latent_dim]


class LatentAttention(nn.Module):
    """MLA, column-parallel by heads (q_b, kv_b), row-parallel output; the latent path is replicated."""

    def __init__(self, cfg: DeepseekConfig, layer: int, tp: TPGroup):
        super().__init__()
        if cfg.num_heads % tp.size:
            raise EagletError(f"num_attention_heads={cfg.num_heads} does not divide by tp={tp.size}")
        self.layer = layer
        self.n = cfg.num_heads // tp.size  # heads on this rank
        self.dn, self.dr, self.dv, self.r = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        self.scale = cfg.attention_scale
        h, qk = cfg.hidden_size, cfg.qk_head_dim
        # The latents are computed whole on every rank (small: H x (q_lora + r + dr)), so each
        # rank's cache holds every slot's latent: the replicated-latent layout of MLA under TP.
        self.q_a = ColumnParallelLinear(h, cfg.q_lora_rank, SINGLE) if cfg.q_lora_rank else None
        self.q_a_norm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS) if cfg.q_lora_rank else None
        self.q_b = ColumnParallelLinear(cfg.q_lora_rank or h, cfg.num_heads * qk, tp)  # q_b_proj, or q_proj
        self.kv_a = ColumnParallelLinear(h, self.r + self.dr, SINGLE)
        self.kv_a_norm = RMSNorm(self.r, LATENT_NORM_EPS)
        self.kv_b = ColumnParallelLinear(self.r, cfg.num_heads * (self.dn + self.dv), tp)
        self.o = RowParallelLinear(cfg.num_heads * self.dv, h, tp)

    def deinterleave_rope(self) -> None:
        """Reorder the rope rows of q and k from (x0, x1), (x2, x3)... pairs to halves, once at load.

        The checkpoint rotates interleaved pairs; apply_rotary rotates halves. Permuting q's and
        k's rope rows alike leaves every q.k product unchanged, and the runtime needs no gather.
        """
        perm = torch.cat([torch.arange(0, self.dr, 2), torch.arange(1, self.dr, 2)])
        with torch.no_grad():
            q = self.q_b.weight.view(self.n, self.dn + self.dr, -1)  # [n, dn + dr, in]
            q[:, self.dn:] = q[:, self.dn:][:, perm.to(q.device)]
            kv = self.kv_a.weight  # [r + dr, H]
            kv[self.r:] = kv[self.r:][perm.to(kv.device)]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttnMeta | None, cache: LatentCache | None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_b(self.q_a_norm(self.q_a(x)) if self.q_a is not None else x)
        q_nope, q_rope = q.view(b, t, self.n, self.dn + self.dr).split([self.dn, self.dr], dim=-1)  # [B, T, n, *]
        latent, k_rope = self.kv_a(x).split([self.r, self.dr], dim=-1)  # [B, T, r], [B, T, dr]
        latent = self.kv_a_norm(latent)
        q_rope = apply_rotary(q_rope, cos, sin)
        k_rope = apply_rotary(k_rope.unsqueeze(2), cos, sin).squeeze(2)  # [B, T, dr]
        if cache is None:
            # Whole sequences (training, feature capture): plain causal attention, or the given mask.
            out = self._expanded(q_nope, q_rope, latent, k_rope, meta.mask if meta is not None else None)
        else:
            cache.write(self.layer, latent, k_rope, meta.slots)
            mask = meta.dense_mask()  # [B, 1, T, S]
            entries, latents = cache.view(self.layer, mask.shape[-1])
            if t <= ABSORB_MAX_QUERIES:
                out = self._absorbed(q_nope, q_rope, entries, mask)
            else:
                out = self._expanded(q_nope, q_rope, latents, entries[..., self.r:], mask)
        return self.o(out.reshape(b, t, self.n * self.dv))

    def _expanded(self, q_nope: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor, k_rope: torch.Tensor,
                  mask: torch.Tensor | None) -> torch.Tensor:
        """Per-head K/V from latents [B, S, r] and rope keys [B, S, dr] -> [B, T, n, dv]; causal without ``mask``."""
        b, s, _ = latent.shape
        kv = self.kv_b(latent).view(b, s, self.n, self.dn + self.dv)
        k_nope, v = kv.split([self.dn, self.dv], dim=-1)  # [B, S, n, dn], [B, S, n, dv]
        k = torch.cat([k_nope, k_rope.unsqueeze(2).expand(b, s, self.n, self.dr)], dim=-1)  # [B, S, n, dn + dr]
        q = torch.cat([q_nope, q_rope], dim=-1)  # [B, T, n, dn + dr]
        out = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, is_causal=mask is None,
                   scale=self.scale)
        return out.transpose(1, 2)

    def _absorbed(self, q_nope: torch.Tensor, q_rope: torch.Tensor, entries: torch.Tensor,
                  mask: torch.Tensor) -> torch.Tensor:
        """Attention in the latent width over cache entries [B, S, r + dr] -> [B, T, n, dv]."""
        w = self.kv_b.weight.view(self.n, self.dn + self.dv, self.r)  # head h: rows [W_UK_h ; W_UV_h]
        q_lat = torch.einsum("btnd,ndr->bntr", q_nope, w[:, : self.dn])  # [B, n, T, r]
        q = torch.cat([q_lat, q_rope.transpose(1, 2)], dim=-1)  # [B, n, T, r + dr]
        scores = torch.einsum("bntc,bsc->bnts", q, entries).float() * self.scale  # [B, n, T, S]
        p = scores.masked_fill(~mask, float("-inf")).softmax(-1).to(entries.dtype)
        out_lat = torch.einsum("bnts,bsr->bntr", p, entries[..., : self.r])  # [B, n, T, r]
        return torch.einsum("bntr,nvr->btnv", out_lat, w[:, self.dn:])  # [B, T, n, dv]
