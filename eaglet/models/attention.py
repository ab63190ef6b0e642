"""Attention over a slot-addressed KV cache, with grouped-query heads.

Two implementations of one function. PyTorch's SDPA is used for long query
blocks (prefill) and on CPU. For the short query blocks of decode, draft steps and
tree verification on CUDA, a grouped formulation (each KV head serves its group of
query heads through a reshape, no K/V repeat) lets torch.compile fuse mask and
softmax into few kernels; with a boolean mask and GQA, SDPA falls back to a path
that copies K/V per query head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# "auto": grouped on CUDA for short query blocks, else SDPA; "sdpa" or "grouped" force one.
IMPL = "auto"
GROUPED_MAX_QUERIES = 128


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              causal: bool = False) -> torch.Tensor:
    """q [B, nq, T, D], k/v [B, nkv, S, D], mask [B, 1, T, S] (True = attend) -> [B, nq, T, D]."""
    use_grouped = not causal and mask is not None and (
        IMPL == "grouped" or (IMPL == "auto" and q.is_cuda and q.shape[2] <= GROUPED_MAX_QUERIES)
    )
    if not use_grouped:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              enable_gqa=q.shape[1] != k.shape[1])
    b, nq, t, d = q.shape
    nkv, s = k.shape[1], k.shape[2]
    g = nq // nkv
    qg = q.reshape(b, nkv, g * t, d)  # [B, nkv, g*T, D]: query heads of one KV head stacked
    scores = torch.matmul(qg, k.transpose(-1, -2)).float() * d**-0.5  # [B, nkv, g*T, S]
    m = mask.expand(b, 1, t, s).unsqueeze(2).expand(b, 1, g, t, s).reshape(b, 1, g * t, s)
    scores = scores.masked_fill(~m, float("-inf"))
    out = torch.matmul(scores.softmax(-1).to(v.dtype), v)  # [B, nkv, g*T, D]
    return out.reshape(b, nq, t, d)
