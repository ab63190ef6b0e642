"""A greedy proposal's top k and log-sum-exp in two launches: ``eaglet::top_k_lse`` (CUDA, Triton).

A tree's growth proposes the top k of the draft's logits for every frontier node and shifts those k
by the row's log-sum-exp (``tree.propose``). Through torch that is a sort of 128-token chunks, a sort
of the chunks' candidates, a gather and the log-sum-exp's reductions: on the H200 a 6,8,48 iteration
spent ~0.14 ms of its 1.57 in the sorts alone, six steps of them (session 25's profile). Here the first
launch gives each (row, chunk of CHUNK logits) program its chunk's top k (k rounds of one max over keys that
pack a value with its index) and the chunk's max and sum of exponentials; the second merges a row's
candidates and sums the same way (on an H100 the six launches of each took 22.5 and 19.0 us a 6,8,48
iteration, against 23.4 and 24.4 with three reductions a round; session 38). Ties go to the lower index.
Logits must be finite (a greedy proposal's are); sampled keys, which may be -inf, keep the torch path.
"""

from __future__ import annotations

import os

import torch

from eaglet.models.slot_moves import HAS_TRITON

# On by default since the H200 timed it (6,8,48 iteration 1.538 -> 1.385 ms); EAGLET_FUSED_TOP_K=0 turns it off.
ENABLED = os.environ.get("EAGLET_FUSED_TOP_K", "1") == "1"
CHUNK = 1024  # logits a first-stage program reads: 24 programs a row over SmolLM2's 24,576-token draft vocabulary
MAX_K = 32  # the rounds of max are unrolled

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _keys(x, ids):
        """float32 x and int ids -> int64 keys whose order is x's, then the lower id: one max a round finds a
        value and its id, where comparing values, then ids, then taking the id took three reductions."""
        b = x.to(tl.int32, bitcast=True)
        s = tl.where(b < 0, b ^ 0x7FFFFFFF, b)  # an int32 in the order of the floats (-0.0 just below 0.0)
        return s.to(tl.int64) * 4294967296 - ids.to(tl.int64)

    @triton.jit
    def _unkey(key):
        """A key -> (its float32 value, its id)."""
        s = ((key + 4294967296 - 1) >> 32).to(tl.int32)  # the id is in [0, 2**32): the ceiling of key / 2**32
        i = s.to(tl.int64) * 4294967296 - key
        return tl.where(s < 0, s ^ 0x7FFFFFFF, s).to(tl.float32, bitcast=True), i

    @triton.jit
    def _chunk_top_k(X, Vals, Ids, Maxes, Sums, V, sx, NCH, K: tl.constexpr, KP: tl.constexpr,
                     CHUNK: tl.constexpr):
        r, c = tl.program_id(0), tl.program_id(1)
        offs = c * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(X + r * sx + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        keys = _keys(x, offs)
        kk = tl.arange(0, KP)
        vals = tl.full([KP], float("-inf"), tl.float32)
        ids = tl.zeros([KP], tl.int32)
        for j in tl.static_range(K):
            key = tl.max(keys, axis=0)
            best, i = _unkey(key)
            if j == 0:  # the chunk's max
                tl.store(Maxes + r * NCH + c, best)
                tl.store(Sums + r * NCH + c, tl.sum(tl.exp(x - best), axis=0))
            vals = tl.where(kk == j, best, vals)
            ids = tl.where(kk == j, i.to(tl.int32), ids)
            keys = tl.where(keys == key, -9223372036854775807, keys)
        out = (r * NCH + c) * K + kk
        tl.store(Vals + out, vals, mask=kk < K)
        tl.store(Ids + out, ids, mask=kk < K)

    @triton.jit
    def _merge_top_k(Vals, Ids, Maxes, Sums, OutVals, OutIds, OutLse, NCH, K: tl.constexpr, NP: tl.constexpr,
                     CP: tl.constexpr):
        r = tl.program_id(0)
        cc = tl.arange(0, NP)
        ok = cc < NCH
        m = tl.load(Maxes + r * NCH + cc, mask=ok, other=float("-inf"))
        s = tl.load(Sums + r * NCH + cc, mask=ok, other=0.0)
        top = tl.max(m, axis=0)
        tl.store(OutLse + r, top + tl.log(tl.sum(s * tl.exp(m - top), axis=0)))
        pos = tl.arange(0, CP)
        has = pos < NCH * K
        v = tl.load(Vals + r * NCH * K + pos, mask=has, other=float("-inf"))
        ids = tl.load(Ids + r * NCH * K + pos, mask=has, other=0)
        # Each candidate's key holds its id: equal values go to the lower id, and ids are distinct.
        keys = tl.where(has, _keys(v, ids), -9223372036854775807)
        for j in tl.static_range(K):
            key = tl.max(keys, axis=0)
            best, i = _unkey(key)
            tl.store(OutVals + r * K + j, best)
            tl.store(OutIds + r * K + j, i)
            keys = tl.where(keys == key, -9223372036854775807, keys)


def usable(x: torch.Tensor, k: int) -> bool:
    """Whether ``top_k_lse`` serves logits ``x`` [..., V] and ``k`` (else the torch path)."""
    return ENABLED and x.is_cuda and HAS_TRITON and 1 < k <= min(MAX_K, x.shape[-1] // 2) and x.shape[-1] > CHUNK


def launch(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [R, V] finite -> (values float32 [R, k] largest first, ids int64 [R, k], log-sum-exp float32 [R])."""
    r, v = x.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    nch = triton.cdiv(v, CHUNK)
    dev = x.device
    vals = torch.empty(r, nch, k, dtype=torch.float32, device=dev)
    ids = torch.empty(r, nch, k, dtype=torch.int32, device=dev)
    maxes = torch.empty(r, nch, dtype=torch.float32, device=dev)
    sums = torch.empty(r, nch, dtype=torch.float32, device=dev)
    _chunk_top_k[(r, nch)](x, vals, ids, maxes, sums, v, x.stride(0), nch, K=k, KP=triton.next_power_of_2(k),
                           CHUNK=CHUNK)
    out_vals = torch.empty(r, k, dtype=torch.float32, device=dev)
    out_ids = torch.empty(r, k, dtype=torch.int64, device=dev)
    lse = torch.empty(r, dtype=torch.float32, device=dev)
    _merge_top_k[(r,)](vals, ids, maxes, sums, out_vals, out_ids, lse, nch, K=k, NP=triton.next_power_of_2(nch),
                       CP=triton.next_power_of_2(nch * k))
    return out_vals, out_ids, lse


@torch.library.custom_op("eaglet::top_k_lse", mutates_args=(), device_types="cuda")
def top_k_lse(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [R, V] finite logits -> (the top k values as float32, their ids, each row's log-sum-exp)."""
    return launch(x, k)


@top_k_lse.register_fake
def _(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r = x.shape[0]
    return (x.new_empty(r, k, dtype=torch.float32), x.new_empty(r, k, dtype=torch.int64),
            x.new_empty(r, dtype=torch.float32))
