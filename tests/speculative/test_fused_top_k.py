"""``eaglet::top_k_lse``: a greedy proposal's top k and log-sum-exp against torch's, and inside propose.

On CUDA with Triton; on the CPU too under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed),
which is how it was first checked on a machine without a GPU.
"""

from __future__ import annotations

import pytest
import torch

from eaglet.sampling import SamplingParams
from eaglet.speculative import fused_top_k
from eaglet.speculative.tree import propose
from tests.conftest import TRITON_DEVICE

DEVICE = TRITON_DEVICE
if DEVICE is None:
    pytestmark = pytest.mark.skip(reason="needs CUDA and Triton (or Triton's interpreter)")


@pytest.mark.parametrize("rows, vocab, k, dtype", [
    (8, 24576, 8, torch.bfloat16),  # a 6,8,48 growth step over SmolLM2's draft vocabulary
    (1, 3000, 8, torch.float32),  # a last chunk of 952
    (3, 2100, 5, torch.bfloat16),  # k not a power of two
    (2, 49152, 16, torch.float32),
])
def test_top_k_and_log_sum_exp_equal_torch(rows, vocab, k, dtype):
    g = torch.Generator().manual_seed(rows * vocab + k)
    x = (torch.randn(rows, vocab, generator=g) * 3).to(dtype).to(DEVICE)
    values, ids, lse = fused_top_k.launch(x, k)
    xf = x.float()
    assert torch.equal(values, xf.topk(k, dim=-1).values)
    assert torch.equal(xf.gather(1, ids), values)
    assert all(len(set(row.tolist())) == k for row in ids.cpu())
    torch.testing.assert_close(lse, torch.logsumexp(xf, dim=-1), rtol=0, atol=1e-5)


def test_negative_logits_and_near_ties_keep_their_order():
    """Every logit below zero (a kernel comparing floats as integers must reverse the order of negative ones'
    bits), and two values one float32 step apart."""
    g = torch.Generator().manual_seed(7)
    x = -(torch.randn(3, 4096, generator=g).abs() + 2.0)
    x[1, 100] = -1.0
    x[1, 3000] = torch.nextafter(torch.tensor(-1.0), torch.tensor(0.0))  # just above -1: first
    values, ids, lse = fused_top_k.launch(x.to(DEVICE), 6)
    assert torch.equal(values.cpu(), x.topk(6, dim=-1).values)
    assert ids[1, :2].tolist() == [3000, 100]
    torch.testing.assert_close(lse.cpu(), torch.logsumexp(x, dim=-1), rtol=0, atol=1e-5)


def test_ties_go_to_the_lower_id():
    x = torch.zeros(2, 2048, device=DEVICE)
    x[:, [5, 1500]] = 1.0
    values, ids, _ = fused_top_k.launch(x, 4)
    assert ids.tolist() == [[5, 1500, 0, 1]] * 2 and values.tolist() == [[1.0, 1.0, 0.0, 0.0]] * 2


def test_propose_takes_the_fused_path_with_the_same_proposals(monkeypatch):
    """The greedy proposal through the operator: the tokens and increments of the torch path (no ties in float32
    draws), with the fused path switched off for the reference."""
    if DEVICE != "cuda":
        pytest.skip("the operator is registered for CUDA")
    g = torch.Generator(device="cuda").manual_seed(3)
    logits = torch.randn(2, 8, 24576, device="cuda", generator=g)
    greedy = SamplingParams(temperature=0.0)
    monkeypatch.setattr(fused_top_k, "ENABLED", True)
    assert fused_top_k.usable(logits, 8)
    ids, inc, _ = propose(logits, 8, greedy, None)
    monkeypatch.setattr(fused_top_k, "ENABLED", False)
    want_ids, want_inc, _ = propose(logits, 8, greedy, None)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(inc, want_inc, rtol=0, atol=1e-5)


def test_compiled_graph_calls_one_opaque_operator():
    if DEVICE != "cuda":
        pytest.skip("torch.compile of the CUDA operator")
    seen = []

    def backend(gm, inputs):
        seen.append(gm.code)
        return gm

    logits = torch.randn(8, 24576, device="cuda")
    out = torch.compile(lambda x: fused_top_k.top_k_lse(x * 2, 8), backend=backend, fullgraph=True)(logits)
    assert "eaglet.top_k_lse" in seen[0]
    assert torch.equal(out[1], fused_top_k.top_k_lse(logits * 2, 8)[1])
