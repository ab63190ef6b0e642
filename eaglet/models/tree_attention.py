"""One Triton kernel for every short query block over the KV cache: decode, draft steps, tree verify.

Each query row ``t`` of batch row ``b`` sees the committed slots ``0..lens[b]-1`` and,
among the ``E`` slots written after them (``lens[b]..lens[b]+E-1``), those where
``extra[b, t, e]`` is set: one decode token sees itself (E = 1), a tree node its
ancestors (E = nodes), a draft frontier node its own ancestors in the scratch region.
The loop over committed slots stops at ``lens[b]``, so a step costs what the context
in use costs, not what the cache could hold; the mask is applied inside, never built
as a [B, 1, T, S] tensor. Grouped-query heads: one program serves the ``G`` query heads
of one KV head for a block of rows (rows are (token, head-in-group) pairs), so each K/V
tile is loaded once per group. Online softmax in float32 (FlashAttention's rescaling).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from eaglet.models.slot_moves import sm_count

MAX_EXTRA = 128  # BLOCK_E is a compile-time block; larger appends (long prefills) use SDPA
# The operator splits a launch of few programs (batch-1 decode: one per KV head) into up to MAX_SPLITS ranges of
# committed slots, aiming at one program per SM in all (EAGLET_ATTN_SPLITS overrides; 1 never splits). Measured
# by scripts/kernel_micro.py on the H200 (session 16): SmolLM2's batch-1 decode over 300 / 1,000 / 3,000 slots
# 6.3 / 13.5 / 34.2 us a layer unsplit, 4.7 / 5.8 / 8.4 split 8; where programs already fill the SMs (the 8B
# shape at batch 16: 128 programs) splitting cost up to 80%, so those launches stay whole.
MAX_SPLITS = int(os.environ.get("EAGLET_ATTN_SPLITS", "8"))


@triton.jit
def _tree_attention(Q, K, V, Out, Lens, Extra, Part, Stats,
                    sqb, sqt, sqh, skb, skh, sks, svb, svh, svs, sob, sot, soh, seb, set_,
                    T, E, QK_SCALE: tl.constexpr, NKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, PREC: tl.constexpr,
                    SPLITS: tl.constexpr):
    pid_bh = tl.program_id(0)
    b = pid_bh // NKV
    kvh = pid_bh % NKV
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [M] row = token * G + head-in-group
    split = tl.program_id(2)
    tok = rows // G
    head = kvh * G + rows % G
    row_ok = tok < T
    d = tl.arange(0, D)
    q = tl.load(Q + b * sqb + tok[:, None] * sqt + head[:, None] * sqh + d[None, :],
                mask=row_ok[:, None], other=0.0)  # [M, D]
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh
    lens = tl.load(Lens + b).to(tl.int32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    # This program's share of the committed slots: all of them, or with SPLITS > 1 one of SPLITS ranges of
    # whole blocks (a range past ``lens`` is empty; the partial results are merged by _merge_splits).
    share = tl.cdiv(tl.cdiv(lens, SPLITS), BLOCK_N) * BLOCK_N
    lo = split * share
    hi = tl.minimum(lo + share, lens)
    for start in range(lo, hi, BLOCK_N):  # committed slots: every row sees them all
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        k = tl.load(k_base + n[None, :] * sks + d[:, None], mask=n_ok[None, :], other=0.0)  # [D, N]
        s = tl.dot(q, k, input_precision=PREC) * QK_SCALE  # [M, N]
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        v = tl.load(v_base + n[:, None] * svs + d[None, :], mask=n_ok[:, None], other=0.0)  # [N, D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    # The new slots lens..lens+E-1, each visible where Extra says so (the last split's share).
    e = tl.arange(0, BLOCK_E)
    e_ok = e < tl.where(split == SPLITS - 1, E, 0)
    n = lens + e
    vis = tl.load(Extra + b * seb + tok[:, None] * set_ + e[None, :],
                  mask=row_ok[:, None] & e_ok[None, :], other=0) != 0  # [M, E]
    k = tl.load(k_base + n[None, :] * sks + d[:, None], mask=e_ok[None, :], other=0.0)  # [D, E]
    s = tl.where(vis, tl.dot(q, k, input_precision=PREC) * QK_SCALE, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # padding rows see nothing
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    v = tl.load(v_base + n[:, None] * svs + d[None, :], mask=e_ok[:, None], other=0.0)  # [E, D]
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    l_i = l_i * alpha + tl.sum(p, 1)
    if SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(Out + b * sob + tok[:, None] * sot + head[:, None] * soh + d[None, :],
                 out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:  # unnormalised: Part [SPLITS, B*T*NQ, D], Stats [2, SPLITS, B*T*NQ] (running max, sum)
        r = (b * T + tok) * (NKV * G) + head  # [M] the output row
        n_rows = tl.num_programs(0) * G * T
        tl.store(Part + (split * n_rows + r[:, None]) * D + d[None, :], acc, mask=row_ok[:, None])
        tl.store(Stats + split * n_rows + r, tl.where(l_i > 0, m_new, float("-inf")), mask=row_ok)
        tl.store(Stats + (SPLITS + split) * n_rows + r, l_i, mask=row_ok)


@triton.jit
def _merge_splits(Part, Stats, Out, n_rows, T, NQ, sob, sot, soh,
                  SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, D: tl.constexpr):
    """One output row from its SPLITS partial results: rescale each to the common maximum, sum, divide."""
    r = tl.program_id(0)
    s = tl.arange(0, BLOCK_S)
    s_ok = s < SPLITS
    m = tl.load(Stats + s * n_rows + r, mask=s_ok, other=float("-inf"))  # [S]
    l_s = tl.load(Stats + (SPLITS + s) * n_rows + r, mask=s_ok, other=0.0)
    top = tl.max(m, 0)
    w = tl.exp2(m - tl.where(top == float("-inf"), 0.0, top))  # [S] 0 where a split saw nothing
    d = tl.arange(0, D)
    acc = tl.load(Part + (s[:, None] * n_rows + r) * D + d[None, :], mask=s_ok[:, None], other=0.0)  # [S, D]
    l_all = tl.sum(l_s * w, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(l_all > 0, l_all, 1.0)
    b, tok, head = r // (T * NQ), (r // NQ) % T, r % NQ
    tl.store(Out + b * sob + tok * sot + head * soh + d, out.to(Out.dtype.element_ty))


def launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lens: torch.Tensor,
           extra: torch.Tensor, splits: int = 1) -> torch.Tensor:
    """The kernel on any tensors Triton runs on. ``splits`` > 1 splits the committed slots into that many
    ranges across programs and merges the partial results in a second kernel: a decode step at batch 1
    runs one program per KV head (SmolLM2: 3 of the H200's 132 SMs, 6.2 us a layer over ~300 slots,
    session 15), which a split spreads. The operator below splits as ``auto_splits`` says."""
    b, t, nq, d = q.shape
    nkv = k_cache.shape[1]
    g = nq // nkv
    e = extra.shape[-1]
    out = torch.empty_like(q)
    block_m = _block_m(t * g)
    block_e = max(16, triton.next_power_of_2(e))
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    grid = (b * nkv, triton.cdiv(t * g, block_m))
    n_rows = b * t * nq
    # Scratch for the partial results (under CUDA graphs from the graph's pool); unsplit, the kernel's code
    # that writes it is compiled out and ``out`` stands in.
    part, stats = out, out
    if splits > 1:
        part = torch.empty(splits, n_rows, d, dtype=torch.float32, device=q.device)
        stats = torch.empty(2, splits, n_rows, dtype=torch.float32, device=q.device)
    _tree_attention[(*grid, splits)](
        q, k_cache, v_cache, out, lens, extra, part, stats,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1), out.stride(2),
        extra.stride(0), extra.stride(1), t, e, QK_SCALE=d ** -0.5 * 1.4426950408889634,  # exp2 domain
        NKV=nkv, G=g, D=d, BLOCK_M=block_m, BLOCK_N=64, BLOCK_E=block_e, PREC=prec, SPLITS=splits, num_warps=4,
    )
    if splits > 1:
        _merge_splits[(n_rows,)](part, stats, out, n_rows, t, nq, out.stride(0), out.stride(1), out.stride(2),
                                 SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits), D=d, num_warps=1)
    return out


def _block_m(rows: int) -> int:
    """Query rows ((token, head-in-group) pairs) a program takes."""
    return 16 if rows <= 16 else 32


def auto_splits(b: int, t: int, nq: int, nkv: int, sms: int, max_splits: int | None = None) -> int:
    """How many ranges the operator splits the committed slots into for a launch of this shape on a GPU of
    ``sms`` SMs: enough to bring its programs near one per SM, at most ``max_splits`` (MAX_SPLITS); 1 for
    launches that already fill the GPU. Static per shape, so each compiled step keeps one."""
    programs = b * nkv * triton.cdiv(t * (nq // nkv), _block_m(t * (nq // nkv)))
    return max(1, min(MAX_SPLITS if max_splits is None else max_splits, sms // programs))


# An opaque operator to torch.compile, not a Triton kernel it traces into: a traced kernel is named in the
# compiled graph by indices into a process-local side table, assigned in the order kernels are traced, and
# the persistent compile cache missed in later processes that compiled in another order (docs/performance.md,
# session 14). Under CUDA graphs the operator costs nothing at replay; inductor never fused the kernel anyway.
@torch.library.custom_op("eaglet::tree_attention", mutates_args=(), device_types="cuda")
def tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lens: torch.Tensor,
                   extra: torch.Tensor) -> torch.Tensor:
    """q [B, T, nq, D]; k/v_cache [B, nkv, S, D]; lens [B]; extra [B, T, E] bool -> [B, T, nq, D]."""
    b, t, nq, _ = q.shape
    splits = auto_splits(b, t, nq, k_cache.shape[1], sm_count(q.device.index or 0))
    return launch(q, k_cache, v_cache, lens, extra, splits)


@tree_attention.register_fake
def _(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lens: torch.Tensor,
      extra: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(q)
