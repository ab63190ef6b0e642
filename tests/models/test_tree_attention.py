"""The Triton attention kernel against the dense masked reference (CUDA only).

Committed slots up to ``lens`` plus a per-query mask over the slots written after them,
grouped-query heads, float32 and bfloat16, lens of 0 included.
"""

from __future__ import annotations

import pytest
import torch

from eaglet.kv_cache import AttnMeta
from tests.conftest import TRITON_DEVICE

KERNEL = TRITON_DEVICE
pytestmark = pytest.mark.skipif(KERNEL is None, reason="needs CUDA and Triton, or Triton's interpreter")


def reference(q, k_cache, v_cache, lens, extra):
    meta = AttnMeta(torch.zeros_like(lens).view(-1, 1), torch.zeros_like(lens).view(-1, 1), lens=lens, extra=extra,
                    n_slots=k_cache.shape[2])
    mask = meta.dense_mask()  # [B, 1, T, S]
    g = q.shape[2] // k_cache.shape[1]
    k, v = (c.double().repeat_interleave(g, 1) for c in (k_cache, v_cache))
    s = torch.einsum("bthd,bhsd->bhts", q.double(), k) * q.shape[-1] ** -0.5
    return torch.einsum("bhts,bhsd->bthd", s.masked_fill(~mask, float("-inf")).softmax(-1), v)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("b, t, nq, nkv, d, e, lens", [
    (2, 1, 9, 3, 64, 1, [5, 700]),  # decode
    (1, 48, 9, 3, 64, 48, [130]),  # tree verify
    (3, 8, 4, 1, 128, 40, [0, 17, 64]),  # draft frontier over a scratch region
    (2, 100, 8, 8, 64, 100, [33, 2]),  # a short prefill
])
@pytest.mark.parametrize("splits", [0, -8, 3, 8])
def test_kernel_matches_dense_reference(dtype, tol, b, t, nq, nkv, d, e, lens, splits, monkeypatch):
    """``splits``: 0 the operator never splitting (EAGLET_ATTN_SPLITS=1), -8 the operator as compiled steps
    call it by default (splitting by ``auto_splits``, up to 8); 3 and 8 the committed slots split across
    programs and merged (float32 checked on the CPU in Triton's interpreter too, session 15)."""
    from eaglet.models import tree_attention as module
    from eaglet.models.tree_attention import launch, tree_attention

    if KERNEL == "cpu" and (dtype != torch.float32 or splits <= 0):
        pytest.skip("the interpreter runs float32, and the operator is registered for CUDA")
    monkeypatch.setattr(module, "MAX_SPLITS", max(1, -splits))

    g = torch.Generator(device=KERNEL).manual_seed(0)
    s = 1024
    q = torch.randn(b, t, nq, d, device=KERNEL, generator=g).to(dtype)
    k_cache, v_cache = (torch.randn(b, nkv, s, d, device=KERNEL, generator=g).to(dtype) for _ in range(2))
    lens = torch.tensor(lens, device=KERNEL)
    extra = torch.rand(b, t, e, device=KERNEL, generator=g) < 0.5
    extra[:, torch.arange(t), torch.arange(t).clamp(max=e - 1)] = True  # every query sees at least itself
    out = tree_attention(q, k_cache, v_cache, lens, extra) if splits <= 0 else \
        launch(q, k_cache, v_cache, lens, extra, splits)
    ref = reference(q, k_cache, v_cache, lens, extra)
    assert torch.isfinite(out).all()
    assert ((out.double() - ref).norm() / ref.norm()).item() < tol


def test_auto_splits_spreads_only_launches_of_few_programs():
    from eaglet.models.tree_attention import auto_splits

    h200 = 132
    assert auto_splits(1, 1, 9, 3, h200, 8) == 8  # SmolLM2 decode at batch 1: 3 programs
    assert auto_splits(1, 48, 9, 3, h200, 8) == 8  # a 48-node verify: 144 rows, 5 blocks a KV head, 15 programs
    assert auto_splits(16, 1, 9, 3, h200, 8) == 2  # 48 programs
    assert auto_splits(4, 1, 32, 8, h200, 8) == 4  # the 8B shape: 32 programs
    assert auto_splits(16, 1, 32, 8, h200, 8) == 1  # 128 programs fill the GPU already
    assert auto_splits(1, 128, 32, 8, h200, 8) == 1  # a prefill chunk
    assert auto_splits(1, 1, 9, 3, h200, 1) == 1  # splitting off


@pytest.mark.skipif(KERNEL != "cuda", reason="the operator is registered for CUDA")
def test_compiled_graph_calls_the_kernel_as_one_opaque_operator():
    """Under torch.compile the kernel is the operator ``eaglet::tree_attention`` (so a compiled graph names no
    process-local kernel index, which kept the persistent compile cache from hitting), with the eager result."""
    from eaglet.models.tree_attention import tree_attention

    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(2, 4, 9, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    k_cache, v_cache = (torch.randn(2, 3, 256, 64, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    lens, extra = torch.tensor([17, 100], device="cuda"), torch.ones(2, 4, 4, dtype=torch.bool, device="cuda")
    seen = []

    def backend(gm, inputs):
        seen.append(gm.code)
        return gm

    def fn(q, k, v, lens, extra):
        return tree_attention(q * 2, k, v, lens, extra) + 1

    out = torch.compile(fn, backend=backend, fullgraph=True)(q, k_cache, v_cache, lens, extra)
    assert "eaglet.tree_attention" in seen[0] and "kernel_idx" not in seen[0]
    assert torch.equal(out, fn(q, k_cache, v_cache, lens, extra))
    compiled = torch.compile(fn, fullgraph=True, dynamic=False)(q, k_cache, v_cache, lens, extra)
    assert ((compiled.float() - out.float()).abs().max()).item() < 0.05
