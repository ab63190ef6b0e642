"""``dense``: oneDNN's packed GEMM for marked CPU float32 weights, F.linear otherwise."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from eaglet.models.layers import dense, pack_linears

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")


def test_packed_matches_linear_and_follows_weight_changes():
    torch.manual_seed(0)
    lin = nn.Linear(64, 96)
    pack_linears(lin)
    for shape in [(1, 64), (3, 8, 64), (2, 100, 64)]:
        x = torch.randn(shape)
        with torch.inference_mode():
            got = dense(x, lin.weight, lin.bias)
        torch.testing.assert_close(got, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert getattr(lin.weight, "_eaglet_packed", None) is not None  # the packed path ran
    with torch.no_grad():
        lin.weight.mul_(2)  # packed again on the next call
    x = torch.randn(4, 64)
    with torch.inference_mode():
        got = dense(x, lin.weight, lin.bias)
    torch.testing.assert_close(got, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


def test_autograd_and_unmarked_weights_take_f_linear():
    lin = nn.Linear(16, 8)
    x = torch.randn(2, 16, requires_grad=True)
    dense(x, lin.weight, lin.bias).sum().backward()  # not marked: plain F.linear
    pack_linears(lin)
    y = dense(x, lin.weight, lin.bias)  # marked, but autograd records: F.linear, gradients flow
    y.sum().backward()
    assert x.grad is not None and lin.weight.grad is not None
