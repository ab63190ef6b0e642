"""A draft's LM head served in int8 on CUDA: ``eaglet::int8_matmul``, a weight-only int8 GEMM in Triton.

On the GPU a draft step's head is a GEMM of a few rows (the frontier: 1-8 at batch 1) against the whole head,
[24,576, 576] for SmolLM2's served draft vocabulary: its cost is reading the weight, and a 6,8,48 iteration
reads it six times. Stored in int8 with one scale per output row (symmetric, as the CPU's ``Int8Linear``) the
read halves. Each program owns BN output columns and all the rows of a BM block: it streams its columns'
int8 weight once, widens it to the activations' dtype in registers, accumulates on the tensor cores in
float32 and applies the row scales at the end. The activations are not quantized, so the only change to the
logits is the weight's rounding (at most half a step of 1/127 of a row's largest weight).
"""

from __future__ import annotations

import torch
from torch import nn

from eaglet.models.int8_linear import quantize_rows
from eaglet.models.slot_moves import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _int8_matmul(X, W, S, Y, M, N, K, sx, sw, sy, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     PRECISION: tl.constexpr):
        rm = tl.program_id(1) * BM + tl.arange(0, BM)
        rn = tl.program_id(0) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            x = tl.load(X + rm[:, None] * sx + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            w = tl.load(W + rn[None, :] * sw + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K), other=0)
            acc = tl.dot(x, w.to(x.dtype), acc, input_precision=PRECISION)  # [BM, BK] @ [BK, BN]
        s = tl.load(S + rn, mask=rn < N, other=0.0)
        tl.store(Y + rm[:, None] * sy + rn[None, :], (acc * s[None, :]).to(Y.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

# Tile: 16 rows (tl.dot's least) x 64 columns x 64 of the input dimension; ``config`` overrides for timing.
CONFIG = {"BN": 64, "BK": 64, "num_warps": 4, "num_stages": 3}


def launch(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """x [M, K], w int8 [N, K], scales float32 [N] -> x @ (w * scales[:, None]).T [M, N] in x's dtype."""
    m, k = x.shape
    n = w.shape[0]
    c = {**CONFIG, **(config or {})}
    x = x if x.stride(-1) == 1 else x.contiguous()
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    bm = max(16, min(64, triton.next_power_of_2(m)))
    _int8_matmul[(triton.cdiv(n, c["BN"]), triton.cdiv(m, bm))](
        x, w, scales, y, m, n, k, x.stride(0), w.stride(0), y.stride(0), BM=bm, BN=c["BN"], BK=c["BK"],
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # float32 stays float32 (bf16 ignores it)
        num_warps=c["num_warps"], num_stages=c["num_stages"])
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
