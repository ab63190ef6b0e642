"""A draft's weights served in int8 on CUDA: ``eaglet::int8_matmul``, a weight-only int8 GEMM in Triton.

On the GPU a draft step's head is a GEMM of a few rows (the frontier: 1-8 at batch 1) against the whole head,
[24,576, 576] for SmolLM2's served draft vocabulary: its cost is reading the weight, and a 6,8,48 iteration
reads it six times. Stored in int8 with one scale per output row (symmetric, as the CPU's ``Int8Linear``) the
read halves. Each program owns BN output columns and all the rows of a BM block: it streams its columns'
int8 weight once, widens it to the activations' dtype in registers, accumulates on the tensor cores in
float32 and applies the row scales at the end. The activations are not quantized, so the only change to the
logits is the weight's rounding (at most half a step of 1/127 of a row's largest weight).

The draft's layer (``Eagle3Draft.int8_projections``) has GEMMs of few output columns and a long input:
a Llama-3.1-8B-shaped draft's ``down_proj`` is [4,096, 14,336], 64 programs of 64 columns for a GPU of 132
SMs, each streaming 0.9 MB, too few loads in flight to draw the card's bandwidth. There the input
dimension is split (``split_k``): each of S programs per column block sums its share into a float32
partial [S, M, N], and a second kernel adds the S partials in a fixed order and applies the scales (two
launches, the same result on every run, no atomics and no zeroed buffer).
"""

from __future__ import annotations

import torch
from torch import nn

from eaglet.models.int8_linear import quantize_rows
from eaglet.models.slot_moves import HAS_TRITON, sm_count

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _int8_matmul(X, W, S, Y, M, N, K, KS, sx, sw, sy, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     PRECISION: tl.constexpr, PARTIAL: tl.constexpr):
        # Program (n, m, s) sums input indices [s*KS, (s+1)*KS) (one split: KS = K): scaled into Y [M, N], or
        # (PARTIAL) unscaled into the float32 partial Y[s] [M, N] that _sum_splits adds.
        rm = tl.program_id(1) * BM + tl.arange(0, BM)
        rn = tl.program_id(0) * BN + tl.arange(0, BN)
        split = tl.program_id(2)
        rk = tl.arange(0, BK)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        end = tl.minimum(K, (split + 1) * KS)
        for k0 in range(split * KS, end, BK):
            kk = k0 + rk
            x = tl.load(X + rm[:, None] * sx + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < end), other=0.0)
            w = tl.load(W + rn[None, :] * sw + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < end), other=0)
            acc = tl.dot(x, w.to(x.dtype), acc, input_precision=PRECISION)  # [BM, BK] @ [BK, BN]
        live = (rm[:, None] < M) & (rn[None, :] < N)
        if PARTIAL:
            tl.store(Y + split * M * N + rm[:, None] * N + rn[None, :], acc, mask=live)
        else:
            s = tl.load(S + rn, mask=rn < N, other=0.0)
            tl.store(Y + rm[:, None] * sy + rn[None, :], (acc * s[None, :]).to(Y.dtype.element_ty), mask=live)

    @triton.jit
    def _sum_splits(P, S, Y, M, N, sy, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
        # Y[m, n] = scale[n] * sum over s of P[s, m, n], the splits added in order.
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = i < M * N
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for s in tl.static_range(SPLITS):
            acc += tl.load(P + s * M * N + i, mask=live, other=0.0)
        n = i % N
        tl.store(Y + (i // N) * sy + n, (acc * tl.load(S + n, mask=live, other=0.0)).to(Y.dtype.element_ty),
                 mask=live)

# Tile: 16 rows (tl.dot's least) x 64 columns x 256 of the input dimension, 8 warps; ``config`` overrides for timing.
# The best of scripts/int8_layer_micro.py's six tiles on an H100 (session 53) summed over a Llama-3.1-8B-shaped
# draft step's six GEMMs (1 or 8 rows, L2 warm or flushed), and on each GEMM within 5% of that GEMM's best: the
# step's GEMMs 216 us with the L2 flushed against 257 with the earlier 64-deep tile and 351 for cuBLAS in bf16.
CONFIG = {"BN": 64, "BK": 256, "num_warps": 8, "num_stages": 2}
# ``split_k``: split the input where the column blocks number fewer than SPLIT_WAVES programs a multiprocessor,
# each split at least MIN_SPLIT_K long (a guess from the occupancy a streaming kernel needs; on the H100 splitting
# took the 8B shape's fc, q/k/v and down_proj from 56-103 us to 29-42 with the 64-deep tile; the constants untimed).
SPLIT_WAVES = 2
MIN_SPLIT_K = 512


def split_k(programs: int, k: int, sms: int, waves: int = SPLIT_WAVES) -> int:
    """How many ways to split an input of ``k`` among ``programs`` column blocks on ``sms`` multiprocessors, aiming
    at ``waves`` programs a multiprocessor."""
    want = -(-waves * sms // programs)  # ceil
    return max(1, min(want, k // MIN_SPLIT_K))


def launch(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """x [M, K], w int8 [N, K], scales float32 [N] -> x @ (w * scales[:, None]).T [M, N] in x's dtype. A weight
    in x's dtype works too (the widening a no-op): scripts/verify_gemm_micro.py times a target's bf16 GEMMs so.

    ``config``: the tile (CONFIG's keys), ``SPLIT``, the input's splits (default: ``split_k``'s choice), and ``WAVES``,
    the programs a multiprocessor ``split_k`` aims at (default SPLIT_WAVES)."""
    m, k = x.shape
    n = w.shape[0]
    c = {**CONFIG, **(config or {})}
    x = x if x.stride(-1) == 1 else x.contiguous()
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    bm = max(16, min(64, triton.next_power_of_2(m)))
    grid = (triton.cdiv(n, c["BN"]), triton.cdiv(m, bm))
    sms = sm_count(x.device.index or 0) if x.is_cuda else 1  # Triton's interpreter: tests pass config["SPLIT"]
    splits = c.get("SPLIT") or split_k(grid[0] * grid[1], k, sms, c.get("WAVES", SPLIT_WAVES))
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # float32 stays float32 (bf16 ignores it)
    tile = {"BM": bm, "BN": c["BN"], "BK": c["BK"], "PRECISION": precision, "num_warps": c["num_warps"],
            "num_stages": c["num_stages"]}
    ks = triton.cdiv(triton.cdiv(k, splits), c["BK"]) * c["BK"]  # each split a whole number of BK steps
    splits = triton.cdiv(k, ks)  # no empty split where K has fewer BK steps than splits asked
    if splits == 1:
        _int8_matmul[(*grid, 1)](x, w, scales, y, m, n, k, k, x.stride(0), w.stride(0), y.stride(0), **tile,
                                 PARTIAL=False)
        return y
    part = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)  # [S, M, N]
    _int8_matmul[(*grid, splits)](x, w, scales, part, m, n, k, ks, x.stride(0), w.stride(0), n, **tile, PARTIAL=True)
    _sum_splits[(triton.cdiv(m * n, 1024),)](part, scales, y, m, n, y.stride(0), SPLITS=splits, BLOCK=1024)
    return y


@torch.library.custom_op("eaglet::int8_matmul", mutates_args=(), device_types="cuda")
def int8_matmul(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ the int8 weight w [N, K] scaled per row -> [M, N] in x's dtype."""
    return launch(x, w, scales)


@int8_matmul.register_fake
def _(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[0])


class CudaInt8Linear(nn.Module):
    """``x @ weight.T`` with ``weight`` [out, in] kept in int8 on the GPU, one scale per output row; inference only."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, scales = quantize_rows(weight)
        self.register_buffer("weight_q", q.contiguous())
        self.register_buffer("scales", scales.to(weight.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.eaglet.int8_matmul(x.reshape(-1, self.in_features), self.weight_q, self.scales)
        return y.view(*x.shape[:-1], self.out_features)  # [..., out]
