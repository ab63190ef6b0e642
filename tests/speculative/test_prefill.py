"""Prefill per bucket (``eaglet/prefill.py``): right-padded to a bucket's rows and length, run into a
scratch cache and copied into the batch's rows, it must leave what the exact-shape prefill leaves.

On the CPU the bucketed forwards run eagerly (``bucketed_prefill=True``), float32: the same caches,
seeds and greedy tokens as the eager prefill, admitted into neighbouring rows and scattered ones. On
CUDA they are captured graphs, and decoding with them must equal decoding without.
"""

from __future__ import annotations

import pytest
import torch

from eaglet.generate import PlainGenerator
from eaglet.prefill import LENGTHS, MAX_TOKENS, token_cap
from eaglet.sampling import SamplingParams
from eaglet.speculative import SpecEngine
from tests.speculative.conftest import random_draft
from tests.speculative.test_engine import prompts_of

CONTEXT = 100  # buckets 16..96


def test_buckets_round_rows_to_a_power_of_two_and_stop_at_the_context(target):
    graphs = PlainGenerator(target, CONTEXT, bucketed_prefill=True).prefills
    assert graphs.lengths == [x for x in LENGTHS if x <= CONTEXT] and graphs.lengths[-1] == 96
    assert graphs.bucket(1, 1) == (1, 16)
    assert graphs.bucket(3, 17) == (4, 32)
    assert graphs.bucket(33, 90) == (64, 96)
    assert graphs.bucket(MAX_TOKENS // 16, 16) == (MAX_TOKENS // 16, 16)
    assert graphs.bucket(MAX_TOKENS // 16 + 1, 5) is None, "a large admission stays eager"
    assert graphs.bucket(MAX_TOKENS // 64, 90) is None, "past MAX_TOKENS padded tokens it stays eager"
    assert graphs.bucket(2, 97) is None, "a prompt past the longest bucket stays eager"
    assert PlainGenerator(target, CONTEXT).prefills is None, "off by default without CUDA graphs"
    for key in graphs.buckets(1):  # a server's warm-up: one row at every length
        graphs.capture(*key)
    assert sorted(graphs.steps) == [(1, n) for n in graphs.lengths]


@pytest.mark.parametrize("rows", [[0, 1, 2], [1, 3], [2]])
def test_bucketed_prefill_leaves_the_caches_and_seeds_of_the_eager_one(target, rows):
    """Admitted into rows of a running batch of 4 (row 0 first holds a prompt, then more join)."""
    draft = random_draft(target, seed=2)
    prompts = prompts_of([5, 17, 40][: len(rows)], seed=4)
    engines = [SpecEngine(target, draft, CONTEXT, 3, 2, 6, adaptive=False, log=lambda _: None, bucketed_prefill=b)
               for b in (False, True)]
    seen = []
    for eng in engines:
        s = eng.session(4, SamplingParams(max_new_tokens=8))
        if 0 not in rows:
            s.admit(0, prompts_of([9], seed=5), SamplingParams(max_new_tokens=8))
        first = s.admit(rows, prompts, SamplingParams(max_new_tokens=8))
        assert (s.graph_parts(rows, prompts) is not None) == (eng is engines[1])
        lens = s.cache.lens.clone()
        slots = int(lens.max())
        seen.append((first, lens, s.dcache.lens.clone(), s.state.seed.clone(),
                     [c[:, :, :slots] for c in (*s.cache.k, *s.cache.v, *s.dcache.k, *s.dcache.v)]))
    (f0, l0, d0, seed0, kv0), (f1, l1, d1, seed1, kv1) = seen
    assert f0 == f1 and torch.equal(l0, l1) and torch.equal(d0, d1)
    torch.testing.assert_close(seed1, seed0, rtol=1e-5, atol=1e-5)
    for mine, ref in zip(kv1, kv0):
        for r in range(4):  # slots past a row's length hold padding in one and nothing in the other
            torch.testing.assert_close(mine[r, :, : l0[r]], ref[r, :, : l0[r]], rtol=1e-5, atol=1e-5)


def test_bucketed_prefill_decodes_the_same_tokens(target):
    prompts = prompts_of([3, 16, 17, 50, 70], seed=6)
    params = SamplingParams(max_new_tokens=20)
    eager = PlainGenerator(target, CONTEXT).generate(prompts, params)
    bucketed = PlainGenerator(target, CONTEXT, bucketed_prefill=True)
    assert [c.tokens for c in bucketed.generate(prompts, params)] == [c.tokens for c in eager]
    for p, ref in zip(prompts, eager):
        assert bucketed.generate([p], params)[0].tokens == ref.tokens
    spec = SpecEngine(target, random_draft(target, seed=2), CONTEXT, 3, 2, 6, adaptive=False, log=lambda _: None,
                      bucketed_prefill=True)
    assert [c.tokens for c in spec.generate(prompts, params)] == [c.tokens for c in eager]


def test_compiled_prefill_buckets_give_the_eager_logits(target):
    """torch.compile refused the layers' compiled region (DecoderLayer) wherever attention ran SDPA over a dense
    mask (the CPU, prefills past the Triton kernel's 128 tokens): the first layer built the mask inside it, a side
    effect. The mask is built before the layers now; compiled buckets of two lengths match the eager ones, and
    share one compile (the length is symbolic from the first bucket)."""
    from torch._dynamo.utils import counters

    from eaglet.generate import target_prefills

    plain, fused = (target_prefills(target, CONTEXT, False, True, compile=c) for c in (False, True))
    compiled_before = counters["frames"]["ok"]
    for prompt in prompts_of([10, 40], seed=7):
        (want,), _ = plain.run([prompt])
        (got,), view = fused.run([prompt])
        torch.testing.assert_close(got[:1], want[:1], rtol=1e-4, atol=1e-4)
        assert int(view.lens[0]) == len(prompt)
    assert counters["frames"]["ok"] - compiled_before == 1


def test_only_one_rows_buckets_are_fused(target):
    """A bucket of more rows runs the unfused forward (fusing it compiled a second time with the rows symbolic,
    minutes on a fresh H100, session 43) and gives what the eager buckets give; one row's buckets share one compile."""
    from torch._dynamo.utils import counters

    from eaglet.generate import target_prefills

    torch._dynamo.reset()  # an earlier test's compile of the same forward would otherwise be reused here
    plain, fused = (target_prefills(target, CONTEXT, False, True, compile=c) for c in (False, True))
    before = counters["stats"]["unique_graphs"]
    for group in (prompts_of([10, 40], seed=9), prompts_of([12], seed=10), prompts_of([5, 7, 30], seed=12)):
        (want,), _ = plain.run(group)
        (got,), view = fused.run(group)
        torch.testing.assert_close(got[:len(group)], want[:len(group)], rtol=1e-4, atol=1e-4)
        assert view.lens.tolist() == [len(p) for p in group]
    assert counters["stats"]["unique_graphs"] - before == 1, "one compile: the one-row buckets'"


def test_compile_prefill_fuses_both_models_buckets_and_decodes_the_same(target):
    prompts = prompts_of([12, 40], seed=8)
    params = SamplingParams(max_new_tokens=6)
    eager = PlainGenerator(target, CONTEXT).generate(prompts, params)
    spec = SpecEngine(target, random_draft(target, seed=2), CONTEXT, 3, 2, 6, adaptive=False, log=lambda _: None,
                      bucketed_prefill=True, compile_prefill=True)
    assert spec.prefills.compiled and spec.draft_prefills.compiled
    assert [c.tokens for c in spec.generate(prompts, params)] == [c.tokens for c in eager]
    assert PlainGenerator(target, CONTEXT, bucketed_prefill=True, compile_prefill=True).prefills.compiled


def test_compiled_prefills_compile_once_either_side_of_the_kernels_limit(target, monkeypatch):
    """CUDA's choice of attention put in on the CPU: the Triton kernel for blocks of at most 128 new tokens (its
    operator run here by a dense reference). Fused prefills of 10, 40, 150 and 200 tokens then compile once for each
    model (until session 40 twice, split at 128 tokens), and speculative decoding still equals plain decoding."""
    pytest.importorskip("triton")
    import torch.nn.functional as F
    from torch._dynamo.utils import counters

    import eaglet.models.attention as attention
    from eaglet.models import tree_attention

    if not getattr(tree_attention.tree_attention, "_cpu_reference", False):
        @tree_attention.tree_attention.register_kernel("cpu")
        def _(q, k_cache, v_cache, lens, extra):  # the kernel's contract, densely (q [B, T, nq, D] -> the same)
            b, t, _, _ = q.shape
            s, e = k_cache.shape[2], extra.shape[-1]
            slot, base = torch.arange(s).view(1, 1, s), lens.view(-1, 1, 1)
            new = (slot >= base) & (slot < base + e)
            seen = (slot < base) | (extra.gather(2, (slot - base).clamp(0, e - 1).expand(b, t, s)) & new)
            return F.scaled_dot_product_attention(q.transpose(1, 2), k_cache, v_cache, attn_mask=seen.unsqueeze(1),
                                                  enable_gqa=True).transpose(1, 2)

        tree_attention.tree_attention._cpu_reference = True

    def as_on_cuda(device, head_dim, new_slots):
        return new_slots <= tree_attention.MAX_EXTRA

    monkeypatch.setattr(attention, "kernel_takes", as_on_cuda)
    prompts, params = prompts_of([10, 40, 150, 200], seed=11), SamplingParams(max_new_tokens=6)
    plain = [c.tokens for c in PlainGenerator(target, 320).generate(prompts, params)]
    eng = SpecEngine(target, random_draft(target, seed=2), 320, 3, 2, 6, adaptive=False, log=lambda _: None,
                     bucketed_prefill=True, compile_prefill=True)
    before = counters["stats"]["unique_graphs"]
    assert [eng.generate([p], params)[0].tokens for p in prompts] == plain
    assert counters["stats"]["unique_graphs"] - before == 2, "one compile for the target's prefill, one for the draft's"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphed_prefill_decodes_as_the_eager_one(tmp_path):
    from tests.speculative.conftest import echo_draft, repeat_prone, tiny_target

    target = repeat_prone(tiny_target(tmp_path, hidden_size=128, intermediate_size=256, num_attention_heads=2,
                                      num_key_value_heads=1))
    draft = echo_draft(target)
    target.model.to("cuda")
    draft.to("cuda")
    prompts = prompts_of([7, 30, 100, 140, 250], seed=3)  # buckets of the Triton kernel (<= 128) and of SDPA
    params = SamplingParams(max_new_tokens=24)
    eager = PlainGenerator(target, 320, bucketed_prefill=False).generate(prompts, params)
    graphed = PlainGenerator(target, 320)
    assert graphed.prefills is not None and graphed.prefills.graphs
    assert [c.tokens for c in graphed.generate(prompts, params)] == [c.tokens for c in eager]
    assert [graphed.generate([p], params)[0].tokens for p in prompts] == [c.tokens for c in eager]
    assert graphed.prefills.bucket(1, 250) == (1, 256)
    eng = SpecEngine(target, draft, 320, 4, 1, 5, adaptive=False, log=lambda _: None)
    assert eng.draft_prefills is not None
    assert [c.tokens for c in eng.generate(prompts, params)] == [c.tokens for c in eager]


def test_a_large_model_graphs_fewer_tokens():
    assert token_cap(135_000_000) == MAX_TOKENS
    assert token_cap(8_000_000_000) == 512, "an 8B prefill of more tokens is compute-bound anyway"
    assert token_cap(10**12) == LENGTHS[0]


def test_a_context_shorter_than_every_bucket_prefills_eagerly(target):
    eng = SpecEngine(target, random_draft(target, seed=2), 12, 3, 2, 6, adaptive=False, log=lambda _: None,
                     bucketed_prefill=True)
    assert eng.prefills.bucket(1, 5) is None and eng.draft_prefills.bucket(1, 5) is None
    ref = PlainGenerator(target, 12).generate(prompts_of([5]), SamplingParams(max_new_tokens=6))
    assert eng.generate(prompts_of([5]), SamplingParams(max_new_tokens=6))[0].tokens == ref[0].tokens


def test_parts_take_all_prompts_at_once_or_powers_of_two_that_fit(target):
    from eaglet.prefill import PrefillGraphs

    graphs = PrefillGraphs(target.model.new_cache, lambda *a: (), torch.device("cpu"), 100, 64, graphs=False)
    assert graphs.lengths == [16, 32, 48, 64]
    assert graphs.parts([[1] * 10] * 4) == [4], "one bucket of 4 x 16 holds them"
    assert graphs.parts([[1] * 10] * 5) == [4, 1], "8 x 16 would pass 64 tokens"
    assert graphs.parts([[1] * 10, [1] * 40, [1] * 10]) == [1, 1, 1]
    assert graphs.parts([[1] * 10, [1] * 65]) is None, "longer than every bucket: eager"


def test_an_admission_larger_than_one_graph_is_split_and_leaves_what_eager_leaves(target, monkeypatch):
    import eaglet.generate

    monkeypatch.setattr(eaglet.generate, "token_cap", lambda params: 32)  # buckets 16 and 32, 32 tokens at most
    draft = random_draft(target, seed=2)
    prompts = prompts_of([3, 16, 17, 20, 9], seed=8)
    params = SamplingParams(max_new_tokens=12)
    seen = []
    for bucketed in (False, True):
        eng = SpecEngine(target, draft, CONTEXT, 3, 2, 6, adaptive=False, log=lambda _: None,
                         bucketed_prefill=bucketed)
        s = eng.session(8, params)
        rows = [6, 0, 3, 1, 7]
        first = s.admit(rows, prompts, params)
        if bucketed:
            assert [len(p) for _, p in s.graph_parts(rows, prompts)] == [2, 1, 1, 1]
        seen.append((first, s.state.seed[rows].clone(), s.cache.lens.clone(),
                     [s.cache.k[0][r, :, : len(p)].clone() for r, p in zip(rows, prompts)]))
        seen[-1] += ([c.tokens for c in eng.generate(prompts, params)],)
    (f0, seed0, lens0, k0, out0), (f1, seed1, lens1, k1, out1) = seen
    assert f0 == f1 and torch.equal(lens0, lens1) and out0 == out1
    torch.testing.assert_close(seed1, seed0, rtol=1e-5, atol=1e-5)
    for mine, ref in zip(k1, k0):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)
