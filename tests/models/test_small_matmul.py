"""The few-row GEMM kernel (an experiment behind EAGLET_SMALL_MM=1) against F.linear (CUDA only; its float32
arithmetic was checked on the CPU in Triton's interpreter, session 15)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eaglet.models.attention import HAS_TRITON

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and HAS_TRITON), reason="needs CUDA and Triton")


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("rows, n, k", [(1, 960, 576), (1, 576, 1536), (3, 3072, 576), (8, 100, 200), (5, 49152, 576)])
@pytest.mark.parametrize("block_n", [0, 8, 16])
def test_kernel_matches_linear(dtype, tol, rows, n, k, block_n):
    from eaglet.models.small_matmul import launch

    g = torch.Generator(device="cuda").manual_seed(rows + n)
    x = torch.randn(1, rows, k, device="cuda", generator=g).to(dtype)
    w = (torch.randn(n, k, device="cuda", generator=g) * k ** -0.5).to(dtype)
    y = launch(x, w, block_n)
    ref = F.linear(x.double(), w.double())
    assert y.shape == (1, rows, n) and y.dtype == dtype
    assert ((y.double() - ref).norm() / ref.norm()).item() < tol


def test_dense_takes_it_for_few_rows_only(monkeypatch):
    """With the experiment on, ``dense`` routes few rows through the operator (also inside a compiled graph)
    and more rows through cuBLAS, with F.linear's result either way."""
    from eaglet.models import layers, small_matmul

    monkeypatch.setattr(layers, "_SMALL_MM", small_matmul)
    calls, real = [], small_matmul.launch
    monkeypatch.setattr(small_matmul, "launch", lambda x, w, bn=0: calls.append(tuple(x.shape)) or real(x, w, bn))
    w = torch.randn(64, 32, device="cuda")
    for rows in (2, 16):
        x = torch.randn(rows, 32, device="cuda")
        assert torch.allclose(layers.dense(x, w), F.linear(x, w), atol=1e-5)
    assert calls == [(2, 32)]
    compiled = torch.compile(lambda x: layers.dense(x, w), fullgraph=True)
    x = torch.randn(4, 32, device="cuda")
    assert torch.allclose(compiled(x), F.linear(x, w), atol=1e-5)
