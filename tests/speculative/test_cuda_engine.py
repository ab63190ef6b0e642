"""The graphed engine on CUDA: one compiled graph per iteration, output equal to plain decoding.

Tiny random target (head_dim 64, grouped-query heads, so the Triton attention kernel
runs) and its echo draft, float32: speculative greedy output must equal plain greedy
output token for token, at batch 1, 3 (padded to 4) and 4, for a chain and a tree. Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from eaglet.generate import PlainGenerator
from eaglet.sampling import SamplingParams
from eaglet.speculative import SpecEngine
from tests.speculative.conftest import echo_draft, repeat_prone, tiny_target
from tests.speculative.test_engine import prompts_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CONTEXT = 160


def _pair(path, vocab: int = 64):
    target = repeat_prone(tiny_target(path, vocab=vocab, hidden_size=128, intermediate_size=256,
                                      num_attention_heads=2, num_key_value_heads=1))
    draft = echo_draft(target)
    target.model.to("cuda")
    return target, draft.to("cuda")


@pytest.fixture(scope="module")
def cuda_pair(tmp_path_factory):
    return _pair(tmp_path_factory.mktemp("cuda"))


@pytest.mark.parametrize("tree", [(4, 1, 5), (4, 3, 12)])
def test_graphed_greedy_identical_to_plain(cuda_pair, tree):
    target, draft = cuda_pair
    prompts = prompts_of([7, 12, 3, 9])
    params = SamplingParams(max_new_tokens=48)
    plain = PlainGenerator(target, CONTEXT).generate(prompts, params)
    eng = SpecEngine(target, draft, CONTEXT, *tree, adaptive=False, log=lambda _: None)
    assert eng.use_graphs and eng.compile
    for batch in ([prompts[0]], prompts[:3], prompts):  # 3 rows run in the bucket of 4
        out = eng.generate(batch, params)
        assert [o.tokens for o in out] == [p.tokens for p in plain[: len(batch)]]
    assert max(a for o in out for a in o.accept_lengths) >= 3, "the echo draft should be accepted"


def test_graphed_batch_speculates_again_after_a_fallback(cuda_pair, monkeypatch):
    """A fallback and the resumption inside one call (``SpecSession._resume``: each running row's caches
    prefilled again through the captured prefills, then the compiled iteration), greedy output still plain's."""
    import eaglet.speculative.policy as policy

    monkeypatch.setattr(policy, "WINDOW", 4)
    monkeypatch.setattr(policy, "LONG_WINDOW", 8)
    monkeypatch.setattr(policy, "RETRY_PLAIN_STEPS", 2)
    target, draft = cuda_pair
    prompts, params, logs = prompts_of([7, 12, 3, 9]), SamplingParams(max_new_tokens=48), []
    plain = PlainGenerator(target, CONTEXT).generate(prompts, params)
    eng = SpecEngine(target, draft, CONTEXT, 4, 1, 5, adaptive=True, log=logs.append)
    eng.policy.plain_step_s[len(prompts)] = 1e-9  # plain steps cost nothing: speculation loses
    out = eng.generate(prompts, params)
    assert [o.tokens for o in out] == [p.tokens for p in plain]
    assert any("trying speculation again" in line for line in logs)


def test_graphed_sampling_runs(cuda_pair):
    target, draft = cuda_pair
    eng = SpecEngine(target, draft, CONTEXT, 3, 2, 6, adaptive=False, log=lambda _: None)
    params = SamplingParams(temperature=0.8, top_k=20, max_new_tokens=30, seed=3)
    a = eng.generate(prompts_of([5, 9]), params)
    b = eng.generate(prompts_of([5, 9]), params)
    assert [o.tokens for o in a] == [o.tokens for o in b], "a seed must fix the output under graphs"
    assert all(len(o.tokens) == 30 for o in a)


def test_graphed_greedy_with_the_fused_top_k_identical_to_plain(tmp_path, monkeypatch):
    """The greedy proposal through ``eaglet::top_k_lse`` inside the captured iteration: a vocabulary of 2,048 (over
    the operator's 1,024-logit chunk, so the fused path is taken) and a tree of top 3."""
    from eaglet.speculative import fused_top_k

    monkeypatch.setattr(fused_top_k, "ENABLED", True)
    target, draft = _pair(tmp_path, vocab=2048)
    assert fused_top_k.usable(torch.zeros(1, 2048, device="cuda"), 3)
    assert _tree_of_3_vs_plain(target, draft) >= 3, "the echo draft should be accepted"


def _tree_of_3_vs_plain(target, draft) -> int:
    """The greedy 4,3,12 engine's output over 2,048-token prompts equals plain decoding's -> its longest accept."""
    prompts = prompts_of([7, 12, 3, 9], vocab=2048)
    params = SamplingParams(max_new_tokens=48)
    plain = PlainGenerator(target, CONTEXT).generate(prompts, params)
    eng = SpecEngine(target, draft, CONTEXT, 4, 3, 12, adaptive=False, log=lambda _: None)
    out = eng.generate(prompts, params)
    assert [o.tokens for o in out] == [p.tokens for p in plain]
    return max(a for o in out for a in o.accept_lengths)


def test_graphed_greedy_with_an_int8_head_identical_to_plain(tmp_path):
    """The draft's LM head through ``eaglet::int8_matmul`` inside the captured iteration: whatever the rounded head
    proposes, the target's verification keeps plain decoding's tokens."""
    from eaglet.models.int8_matmul import CudaInt8Linear

    target, draft = _pair(tmp_path, vocab=2048)
    draft.lm_head = CudaInt8Linear(draft.lm_head.weight)
    assert _tree_of_3_vs_plain(target, draft) > 1, "the int8 head's proposals should be taken"


def test_graphed_greedy_with_an_int8_draft_identical_to_plain(tmp_path, monkeypatch):
    """The whole draft (fc, the layer's projections, the head) through ``eaglet::int8_matmul`` inside the captured
    iteration, the inputs split (MIN_SPLIT_K lowered to this tiny draft's sizes): plain decoding's tokens."""
    from eaglet.models.int8_matmul import CudaInt8Linear

    monkeypatch.setattr("eaglet.models.int8_matmul.MIN_SPLIT_K", 64)

    target, draft = _pair(tmp_path, vocab=2048)
    draft.lm_head = CudaInt8Linear(draft.lm_head.weight)
    draft.fuse_projections().int8_projections(CudaInt8Linear)
    assert _tree_of_3_vs_plain(target, draft) > 1, "the int8 draft's proposals should be taken"
