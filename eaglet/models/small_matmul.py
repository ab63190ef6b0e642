"""x @ W.T for a few rows (decode at small batches, draft steps): one Triton kernel, an experiment.

On the H200 a SmolLM2 decode step at batch 1 spends 0.48 ms of its 0.85 ms of kernel time in 120
cuBLAS GEMMs of one row, ~4 us each, where reading their weights takes ~0.5 us at the measured
bandwidth (docs/performance.md, session 15): a fixed cost per call, not bandwidth. This kernel gives
each program ``BLOCK_N`` output columns for every row and streams their weight rows once, a
multiply-and-sum in float32 (no tensor cores: with at most 8 rows there is nothing for them to do).
Whether it beats cuBLAS is for ``scripts/kernel_micro.py`` to show on the GPU; until then
``dense`` takes it only with EAGLET_SMALL_MM=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 8


@triton.jit
def _small_mm(X, W, Y, M, N, K, sxm, swn, sym,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [N] this program's output columns
    m = tl.arange(0, BLOCK_M)  # [M] every row
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(X + m[:, None] * sxm + k[None, :], mask=(m[:, None] < M) & (k[None, :] < K), other=0.0)
        w = tl.load(W + n[:, None] * swn + k[None, :], mask=(n[:, None] < N) & (k[None, :] < K), other=0.0)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)  # [M, N]
    tl.store(Y + m[:, None] * sym + n[None, :], acc.to(Y.dtype.element_ty), mask=(m[:, None] < M) & (n[None, :] < N))


def launch(x: torch.Tensor, weight: torch.Tensor, block_n: int = 0) -> torch.Tensor:
    """x [..., K] (at most MAX_ROWS rows in all) @ weight [N, K].T -> [..., N] on any tensors Triton runs on.
    ``block_n`` 0: 8 columns a program for narrow outputs (more programs), 16 for wide ones."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    m, n = x2.shape[0], weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_n = block_n or (8 if n < 2048 else 16)
    _small_mm[(triton.cdiv(n, block_n),)](
        x2, weight, y, m, n, k, x2.stride(0), weight.stride(0), y.stride(0),
        BLOCK_M=max(1, triton.next_power_of_2(m)), BLOCK_N=block_n, BLOCK_K=64, num_warps=4)
    return y.reshape(*x.shape[:-1], n)


@torch.library.custom_op("eaglet::small_mm", mutates_args=(), device_types="cuda")
def small_mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ weight [N, K].T -> [..., N]; an opaque operator to torch.compile, as cuBLAS is."""
    return launch(x, weight)


@small_mm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether ``dense`` (with EAGLET_SMALL_MM=1) takes the kernel: CUDA, no bias, a 2-D weight with
    contiguous rows, few rows of x, no autograd."""
    return (x.is_cuda and bias is None and weight.dim() == 2 and weight.stride(1) == 1
            and x.numel() // x.shape[-1] <= MAX_ROWS and not (x.requires_grad and torch.is_grad_enabled()))
