import pytest
import torch

from eaglet.models import attention as attn


@pytest.mark.parametrize("nq,nkv", [(4, 4), (6, 2), (4, 1)])
def test_grouped_equals_sdpa(nq, nkv, monkeypatch):
    torch.manual_seed(0)
    b, t, s, d = 2, 5, 11, 8
    q, k, v = torch.randn(b, nq, t, d), torch.randn(b, nkv, s, d), torch.randn(b, nkv, s, d)
    mask = torch.rand(b, 1, t, s) > 0.4
    mask[..., 0] = True  # every query sees at least one slot
    monkeypatch.setattr(attn, "IMPL", "sdpa")
    ref = attn.attention(q, k, v, mask)
    monkeypatch.setattr(attn, "IMPL", "grouped")
    out = attn.attention(q, k, v, mask)
    print("max abs diff grouped vs sdpa:", (out - ref).abs().max().item())
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
