"""The serving draft's fused projections (q/k/v and gate/up as one matrix each) compute what the
separate ones do, leave training and checkpoints alone, and change no speculative output."""

from __future__ import annotations

import copy

import torch

from eaglet.generate import PlainGenerator
from eaglet.kv_cache import AttnMeta
from eaglet.sampling import SamplingParams
from eaglet.speculative import SpecEngine
from tests.speculative.conftest import random_draft
from tests.speculative.test_engine import CONTEXT, prompts_of


def _cached_forward(draft, target, ids: torch.Tensor) -> torch.Tensor:
    """The draft over a fresh cache (the inference path): ids [B, T] -> pre-norm out [B, T, H]."""
    cache = draft.new_cache(ids.shape[0], 64)
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(*ids.shape, draft.config.hidden_size, generator=g)
    return draft(hidden, target.model.embed(ids), cache.append_meta(ids.shape[1]), cache)


def test_fused_projections_match_separate_ones(target):
    draft = random_draft(target, seed=4)
    fused = copy.deepcopy(draft).fuse_projections()
    ids = torch.tensor(prompts_of([9, 9]))
    want, got = _cached_forward(draft, target, ids), _cached_forward(fused, target, ids)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        fused.midlayer.mlp.gate_up.weight.zero_()
    assert not torch.allclose(_cached_forward(fused, target, ids), want, atol=1e-3), "the cache path reads the copy"
    assert set(fused.state_dict()) == set(draft.state_dict()), "checkpoints keep the separate projections"


def test_training_path_ignores_the_fused_copy(target):
    draft = copy.deepcopy(random_draft(target, seed=5)).fuse_projections()
    with torch.no_grad():
        draft.midlayer.self_attn.qkv.weight.zero_()  # a stale copy must not reach the training forward
        draft.midlayer.mlp.gate_up.weight.zero_()
    for p in draft.parameters():
        p.requires_grad_(True)
    ids = torch.tensor(prompts_of([6]))
    h = torch.randn(1, 6, draft.config.hidden_size)
    meta_mask = torch.ones(1, 1, 6, 6, dtype=torch.bool).tril()
    pos = torch.arange(6).unsqueeze(0)
    out = draft(h, target.model.embed(ids), AttnMeta(pos, pos, mask=meta_mask), past=[])
    out.sum().backward()
    assert draft.midlayer.self_attn.q_proj.weight.grad.abs().sum() > 0
    assert draft.midlayer.mlp.up_proj.weight.grad.abs().sum() > 0


def test_a_forward_without_autograd_reads_the_serving_copies(target):
    """The training path (``past``, no cache) reads the fused copies where autograd records nothing, as the
    doctor's unroll of a served draft does (check 5), and the separate projections where it records."""
    draft = copy.deepcopy(random_draft(target, seed=7)).fuse_projections()
    ids = torch.tensor(prompts_of([6]))
    h = torch.randn(1, 6, draft.config.hidden_size)
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool).tril()
    pos = torch.arange(6).unsqueeze(0)

    def forward():
        return draft(h, target.model.embed(ids), AttnMeta(pos, pos, mask=mask), past=[])

    with torch.no_grad():
        before = forward()
        draft.midlayer.mlp.gate_up.weight.zero_()
        assert not torch.allclose(forward(), before, atol=1e-3), "without autograd the copy serves"
    with torch.enable_grad():
        assert torch.allclose(forward(), before, atol=1e-5), "with autograd the separate projections serve"


def test_engine_with_fused_draft_equals_plain_and_unfused(target):
    draft = random_draft(target, seed=6, scale=4.0)
    prompts = prompts_of([7, 12, 3])
    params = SamplingParams(max_new_tokens=32)
    plain = PlainGenerator(target, CONTEXT).generate(prompts, params)
    runs = {}
    for name, d in (("separate", draft), ("fused", copy.deepcopy(draft).fuse_projections())):
        runs[name] = SpecEngine(target, d, CONTEXT, 3, 2, 6, adaptive=False, log=lambda _: None).generate(
            prompts, params)
    for name, out in runs.items():
        assert [o.tokens for o in out] == [p.tokens for p in plain], name
    assert [o.accept_lengths for o in runs["fused"]] == [o.accept_lengths for o in runs["separate"]]
