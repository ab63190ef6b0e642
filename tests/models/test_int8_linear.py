"""``Int8Linear``: a draft's LM head (and layer) served in int8 on an x86 CPU; greedy outputs stay plain decoding's."""

import copy

import pytest
import torch

from eaglet.errors import EagletError
from eaglet.models.int8_linear import Int8Linear, int8_gemm_available

pytestmark = pytest.mark.skipif(not int8_gemm_available(), reason="no fbgemm int8 GEMM on this CPU")


def test_int8_head_is_close_to_float_and_keeps_the_leading_shape():
    torch.manual_seed(0)
    w = torch.randn(300, 64) * 0.05
    head = Int8Linear(w)
    for shape in [(1, 64), (2, 5, 64)]:
        x = torch.randn(shape)
        got, want = head(x), x @ w.T
        assert got.shape == (*shape[:-1], 300)
        # 8-bit weights and 7-bit activations: ~1% of the logits' range, not float32's 1e-6
        err = (got - want).abs().max() / want.abs().max()
        assert 1e-6 < err < 0.05, err
        same_top = (got.argmax(-1) == want.argmax(-1)).float().mean()
        assert same_top >= 0.8, same_top


def served(tmp_path, monkeypatch):
    """(target, load): a tiny float32 target that often repeats itself and ``load_engine_draft`` serving its
    echo draft (which proposes the target's own next token: acceptance is partial, tests/speculative)."""
    from eaglet.speculative.load import load_engine_draft
    from tests.speculative.conftest import echo_draft, repeat_prone, tiny_target

    target = repeat_prone(tiny_target(tmp_path / "t"))
    monkeypatch.setattr("eaglet.draft.compat.load_draft_for",
                        lambda path, t, device, dtype: (echo_draft(t).to(device, dtype), {}))
    return target, lambda **kw: load_engine_draft(tmp_path / "d", target, **kw)


def test_served_drafts_take_an_int8_head_on_a_float32_cpu_target_and_refuse_it_elsewhere(tmp_path, monkeypatch):
    target, load = served(tmp_path, monkeypatch)
    assert isinstance(load().lm_head, Int8Linear)
    assert not isinstance(load(int8_head=False).lm_head, Int8Linear)
    target.model.to(torch.bfloat16)
    assert not isinstance(load().lm_head, Int8Linear)  # None: where possible
    with pytest.raises(EagletError, match="float32 target on an x86 CPU"):
        load(int8_head=True)


def speculation_keeps_plain_output(target, draft) -> int:
    """Greedy speculation with ``draft`` gives plain decoding's tokens; returns its longest accept length."""
    from eaglet.generate import PlainGenerator
    from eaglet.sampling import SamplingParams
    from eaglet.speculative import SpecEngine

    prompts = [[1, 5, 9, 2], [7, 3, 3, 8, 11, 4]]
    params = SamplingParams(max_new_tokens=32)
    plain = PlainGenerator(target, 128).generate(prompts, params)
    spec = SpecEngine(target, draft, 128, 3, 2, 5, adaptive=False).generate(prompts, params)
    assert [c.tokens for c in spec] == [c.tokens for c in plain]
    return max(n for c in spec for n in c.accept_lengths)


def test_speculative_greedy_output_with_an_int8_head_equals_plain(tmp_path, monkeypatch):
    """The head only proposes: whatever it proposes, the target's verification keeps plain decoding's tokens."""
    target, load = served(tmp_path, monkeypatch)
    draft = load()
    assert isinstance(draft.lm_head, Int8Linear)
    assert speculation_keeps_plain_output(target, draft) > 1  # the int8 head's proposals were taken


def test_an_int8_layer_stays_near_the_float_one_and_speculation_keeps_plain_output(tmp_path, monkeypatch):
    """``int8_layer``: fc and the layer's five projections in int8 beside the head (a CPU's default with the head in
    int8); the draft's output moves by rounding (not by float32's 1e-6), and the target's verification still keeps
    plain decoding's tokens."""
    from tests.speculative.conftest import random_draft
    from tests.speculative.test_fused_draft import _cached_forward

    target, load = served(tmp_path, monkeypatch)
    ref = random_draft(target, seed=4).fuse_projections()  # every projection non-zero, unlike the echo draft's
    quantized = copy.deepcopy(ref).int8_projections(Int8Linear)
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    got, want = _cached_forward(quantized, target, ids), _cached_forward(ref, target, ids)
    err = (got - want).abs().max() / want.abs().max()
    assert 1e-6 < err < 0.05, err
    draft = load()  # by default on a CPU that serves the head in int8
    attn, mlp = draft.midlayer.self_attn, draft.midlayer.mlp
    assert all(isinstance(m, Int8Linear) for m in (draft.fc, attn.qkv, attn.o_proj, mlp.gate_up, mlp.down_proj))
    assert not isinstance(load(int8_layer=False).fc, Int8Linear) and not isinstance(load(int8_head=False).fc,
                                                                                    Int8Linear)
    assert isinstance(load(int8_head=False, int8_layer=True).fc, Int8Linear)
    assert speculation_keeps_plain_output(target, draft) > 1  # the int8 draft's proposals were taken
    target.model.to(torch.bfloat16)
    with pytest.raises(EagletError, match="an int8 draft layer needs a float32 target"):
        load(int8_head=False, int8_layer=True)
