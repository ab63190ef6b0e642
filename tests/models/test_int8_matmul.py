"""``eaglet::int8_matmul``: the draft's LM head in int8 on CUDA (Triton), against the dequantized weight.

The kernel runs on CUDA with Triton, and on the CPU under Triton's interpreter (float32 only there: the
interpreter cannot run bf16). The engine on CUDA with the int8 head: tests/speculative/test_cuda_engine.py.
"""

from __future__ import annotations

import pytest
import torch

from eaglet.models.int8_linear import quantize_rows
from eaglet.models.int8_matmul import launch
from tests.conftest import TRITON_DEVICE

DEVICE = TRITON_DEVICE
if DEVICE is None:
    pytestmark = pytest.mark.skip(reason="needs CUDA and Triton (or Triton's interpreter)")


def test_rows_round_to_within_half_a_step_of_their_own_scale():
    w = torch.randn(50, 70) * torch.logspace(-3, 1, 50).unsqueeze(1)  # rows of very different ranges
    q, scales = quantize_rows(w)
    assert q.dtype == torch.int8 and q.abs().max() == 127
    assert ((q.float() * scales[:, None] - w).abs() <= scales[:, None] / 2 + 1e-7).all()
    assert torch.equal(q.abs().amax(1), torch.full((50,), 127, dtype=torch.int8))  # each row uses its range


@pytest.mark.parametrize("m, n, k", [
    (1, 1000, 576),  # one frontier row; N not a multiple of the tile
    (8, 2048, 576),  # a 6,8,48 growth step's rows
    (37, 300, 100),  # K not a multiple of the tile, rows over one block of 16
    (70, 129, 64),  # rows over the largest block (64): two row blocks
])
def test_matches_the_dequantized_weight(m, n, k):
    g = torch.Generator().manual_seed(m * n + k)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * 0.05
    q, s = quantize_rows(w)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    x = x.to(DEVICE, dtype)
    got = launch(x, q.to(DEVICE), s.to(DEVICE))
    want = x.float() @ (q.float() * s[:, None]).to(DEVICE).T
    assert got.shape == (m, n) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2 * want.abs().max().item()
    torch.testing.assert_close(got.float(), want, rtol=0, atol=tol)
    # and close to the float weight it stands for: the rounding moves a logit by far less than its range
    assert (got.float() - x.float() @ w.to(DEVICE).T).abs().max() < 0.05 * want.abs().max()


def test_a_strided_input_row_is_read_as_its_values():
    x = torch.randn(4, 2 * 96)[:, ::2]  # stride 2 along K: copied contiguous first
    q, s = quantize_rows(torch.randn(200, 96))
    got = launch(x.to(DEVICE), q.to(DEVICE), s.to(DEVICE))
    torch.testing.assert_close(got.cpu(), x @ (q.float() * s[:, None]).T, rtol=0, atol=1e-4)
