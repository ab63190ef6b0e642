"""``rms_norm``: torch's op eagerly, the float32 formula when traced; the same numbers either way."""

import pytest
import torch
import torch.nn.functional as F

from eaglet.models.layers import RMSNorm, rms_norm


def _formula(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_and_traced_agree_with_the_float32_formula(dtype):
    torch.manual_seed(0)
    x = (torch.randn(3, 7, 576) * torch.logspace(-2, 3, 576)).to(dtype)  # channels of very different scales
    want = _formula(x, 1e-5)
    eager = rms_norm(x, 1e-5)
    assert eager.dtype == dtype
    torch.testing.assert_close(eager, want, rtol=0, atol=0)  # on the CPU torch's op is the formula
    seen = []

    def backend(gm, _):  # records what was traced, runs it eagerly
        seen.extend(str(n.target) for n in gm.graph.nodes)
        return gm

    torch._dynamo.reset()
    traced = torch.compile(lambda t: rms_norm(t, 1e-5), backend=backend, fullgraph=True)(x)
    torch.testing.assert_close(traced, want, rtol=0, atol=0)
    assert any("rsqrt" in t for t in seen) and not any("rms_norm" in t for t in seen)  # the formula branch


def test_module_keeps_the_cast_before_the_weight():
    # Hugging Face's Llama multiplies the weight after casting back (bf16 * bf16), not in float32.
    torch.manual_seed(1)
    norm = RMSNorm(64, 1e-6).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    x = torch.randn(5, 64, dtype=torch.bfloat16) * 40
    torch.testing.assert_close(norm(x), norm.weight * _formula(x, 1e-6), rtol=0, atol=0)
    assert not torch.equal(norm(x), F.rms_norm(x.float(), (64,), norm.weight.float(), 1e-6).to(torch.bfloat16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_fused_op_and_the_compiled_formula_agree_with_the_formula():
    torch.manual_seed(2)
    x = (torch.randn(4, 300, 576, device="cuda") * torch.logspace(-2, 3, 576, device="cuda")).bfloat16()
    want = _formula(x, 1e-5)
    torch.testing.assert_close(rms_norm(x, 1e-5), want)  # a bf16 rounding apart at most (reduction order)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(lambda t: rms_norm(t, 1e-5), fullgraph=True)(x), want)
