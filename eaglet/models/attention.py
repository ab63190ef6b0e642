"""Attention over a slot-addressed KV cache, with grouped-query heads.

Three implementations of one function. On CUDA, the short query blocks of decode,
draft steps and tree verification run one Triton kernel per layer (tree_attention.py)
that reads only the slots in use and applies the mask inside. PyTorch's SDPA serves
long query blocks (prefill), the CPU, and training. A grouped formulation (each KV
head serves its group of query heads through a reshape, no K/V repeat) is kept for
comparison: with a boolean mask and GQA, SDPA falls back to a path that copies K/V
per query head.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from eaglet.kv_cache import AttnMeta, LayerKV
from eaglet.models.slot_moves import HAS_TRITON

# "auto": the Triton kernel on CUDA for short query blocks, else SDPA; "triton", "grouped"
# or "sdpa" force one where it applies (benchmarks compare them).
IMPL = "auto"
GROUPED_MAX_QUERIES = 128
if HAS_TRITON and torch.cuda.is_available():
    # Registers the kernel's operator (eaglet::tree_attention) now, not first inside a traced forward.
    import eaglet.models.tree_attention  # noqa: F401


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shapes_vary: bool = False, **kw) -> torch.Tensor:
    """F.scaled_dot_product_attention, never with its cuDNN kernel in eager CUDA calls nor where ``shapes_vary``
    (a prefill into empty rows, compiled with symbolic lengths in the graphed prefills): that kernel builds a plan
    for every new shape (~1 s per training step on an H200 with length-bucketed batches, measured), where the
    others need none, and training batches, prefills and regeneration's admissions bring new shapes all the time
    (torch 2.11 puts cuDNN first on Hopper). Other compiled steps have static shapes: a plan there is built once."""
    plan_free = q.is_cuda and (shapes_vary or not torch.compiler.is_compiling())
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]) \
            if plan_free else nullcontext():
        return F.scaled_dot_product_attention(q, k, v, **kw)


def kernel_applies(device: torch.device, head_dim: int, meta: AttnMeta) -> bool:
    """Whether ``cached_attention`` runs the Triton kernel for queries on ``device`` (else SDPA: its causal path
    for a prefill into empty rows, or over ``meta.dense_mask()``). Rows known ``empty`` never reach the kernel's
    test of the new slots, which a compiled prefill of symbolic length would guard on and compile twice for."""
    return not meta.empty and meta.extra is not None and kernel_takes(device, head_dim, meta.extra.shape[-1])


def kernel_takes(device: torch.device, head_dim: int, new_slots: int) -> bool:
    """Whether the Triton kernel serves queries on ``device`` that see ``new_slots`` slots written after the
    committed ones."""
    if IMPL not in ("auto", "triton") or not (device.type == "cuda" and HAS_TRITON):
        return False
    from eaglet.models.tree_attention import MAX_EXTRA

    return new_slots <= MAX_EXTRA and head_dim in (64, 128)


def cached_attention(q: torch.Tensor, kv: LayerKV, meta: AttnMeta) -> torch.Tensor:
    """q [B, T, nq, D] over one layer of the cache (this forward's K/V already written) -> [B, T, nq, D]."""
    if kernel_applies(q.device, q.shape[-1], meta):
        from eaglet.models.tree_attention import tree_attention

        return tree_attention(q, kv.k, kv.v, meta.lens, meta.extra)
    if meta.from_empty():  # a prefill into empty rows: causal over its own tokens, SDPA's fused kernels apply
        keys, vals = kv.view(q.shape[1])
        return attention(q.transpose(1, 2), keys, vals, None, causal=True, shapes_vary=True).transpose(1, 2)
    mask = meta.dense_mask()
    keys, vals = kv.view(mask.shape[-1])  # [B, nkv, S, D]
    return attention(q.transpose(1, 2), keys, vals, mask).transpose(1, 2)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              causal: bool = False, shapes_vary: bool = False) -> torch.Tensor:
    """q [B, nq, T, D], k/v [B, nkv, S, D], mask [B, 1, T, S] (True = attend) -> [B, nq, T, D]. ``shapes_vary``:
    as ``sdpa`` takes it."""
    use_grouped = not causal and mask is not None and (
        IMPL == "grouped" or (IMPL == "auto" and q.is_cuda and q.shape[2] <= GROUPED_MAX_QUERIES)
    )
    if not use_grouped:
        return sdpa(q, k, v, shapes_vary, attn_mask=mask, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    b, nq, t, d = q.shape
    nkv, s = k.shape[1], k.shape[2]
    g = nq // nkv
    qg = q.reshape(b, nkv, g * t, d)  # [B, nkv, g*T, D]: query heads of one KV head stacked
    scores = torch.matmul(qg, k.transpose(-1, -2)).float() * d**-0.5  # [B, nkv, g*T, S]
    m = mask.expand(b, 1, t, s).unsqueeze(2).expand(b, 1, g, t, s).reshape(b, 1, g * t, s)
    scores = scores.masked_fill(~m, float("-inf"))
    out = torch.matmul(scores.softmax(-1).to(v.dtype), v)  # [B, nkv, g*T, D]
    return out.reshape(b, nq, t, d)
