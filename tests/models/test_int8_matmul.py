"""``eaglet::int8_matmul``: the draft's LM head in int8 on CUDA (Triton), against the dequantized weight.

The kernel runs on CUDA with Triton, and on the CPU under Triton's interpreter (float32 only there: the
interpreter cannot run bf16). The engine on CUDA with the int8 head: tests/speculative/test_cuda_engine.py.
"""

from __future__ import annotations

import pytest
import torch

from eaglet.models.int8_linear import quantize_rows
from eaglet.models.int8_matmul import launch, split_k
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


@pytest.mark.parametrize("m, n, k, splits", [
    (8, 96, 1000, 3),  # a draft layer's rows; K's last split shorter and not a multiple of the tile
    (1, 70, 512, 4),  # one row, N not a multiple of the tile
    (20, 64, 300, 8),  # more splits asked than K's tiles: as many as there are
])
def test_a_split_input_sums_to_the_unsplit_product(m, n, k, splits):
    g = torch.Generator().manual_seed(m + n + k)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    q, s = quantize_rows(w)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    x, q, s = x.to(DEVICE, dtype), q.to(DEVICE), s.to(DEVICE)
    whole, split = launch(x, q, s, {"SPLIT": 1}), launch(x, q, s, {"SPLIT": splits})
    tol = 1e-4 if dtype == torch.float32 else 2e-2 * whole.float().abs().max().item()
    torch.testing.assert_close(split.float(), whole.float(), rtol=0, atol=tol)
    torch.testing.assert_close(split.float(), x.float() @ (q.float() * s[:, None]).T, rtol=0, atol=tol)
    assert torch.equal(launch(x, q, s, {"SPLIT": splits}), split), "the splits add in a fixed order"


@pytest.mark.parametrize("splits", [1, 3])
def test_a_weight_in_the_inputs_dtype_is_read_as_it_is(splits):
    # scripts/verify_gemm_micro.py and spec_step_costs.py --triton-gemm-rows time the kernel over a target's bf16
    # weights (scales of one) at verify's 48 rows: the widening is then a no-op and the product is x @ w.T.
    g = torch.Generator().manual_seed(splits)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    x, w = (torch.randn(48, 600, generator=g).to(DEVICE, dtype), torch.randn(130, 600, generator=g).to(DEVICE, dtype))
    got = launch(x, w, torch.ones(130, device=DEVICE), {"SPLIT": splits})
    want = x.float() @ w.float().T
    tol = 1e-4 if dtype == torch.float32 else 2e-2 * want.abs().max().item()
    torch.testing.assert_close(got.float(), want, rtol=0, atol=tol)


def test_the_input_is_split_only_where_column_blocks_are_too_few():
    assert split_k(programs=500, k=4096, sms=132) == 1  # a Llama-3.1-8B-shaped head: 500 blocks of 64 columns
    assert split_k(programs=64, k=14336, sms=132) == 5  # its down_proj: 64 blocks, 2 a multiprocessor wanted
    assert split_k(programs=64, k=4096, sms=132) == 5
    assert split_k(programs=9, k=1728, sms=132) == 3  # SmolLM2's fc: no split shorter than MIN_SPLIT_K
    assert split_k(programs=9, k=300, sms=132) == 1
    assert split_k(programs=64, k=14336, sms=132, waves=4) == 9  # more programs a multiprocessor asked
    assert split_k(programs=64, k=14336, sms=132, waves=1) == 3
