"""SpecEngine: greedy equivalence with plain decoding, cache consistency after rollback, stops, errors."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from eaglet.errors import EagletError
from eaglet.generate import TREE_SLACK, PlainGenerator
from eaglet.sampling import SamplingParams
from eaglet.speculative import SpecEngine
from eaglet.speculative.drafting import draft_prefill
from eaglet.speculative.verify import prefill
from tests.speculative.conftest import echo_draft, random_draft, repeat_prone, tiny_target

TREES = {"chain": (4, 1, 5), "tree": (4, 3, 12), "wide": (3, 4, 21), "one-step": (1, 3, 4)}
CONTEXT = 160


def prompts_of(lengths, vocab=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def spec(target, draft, tree, **kw):
    return SpecEngine(target, draft, CONTEXT, *TREES[tree], adaptive=False, log=lambda _: None, **kw)


@pytest.fixture(scope="module")
def plain_out(agreeing):
    target, _ = agreeing
    prompts = prompts_of([7, 12, 3, 9])
    out = PlainGenerator(agreeing[0], CONTEXT).generate(prompts, SamplingParams(max_new_tokens=48))
    return prompts, out


@pytest.mark.parametrize("tree", list(TREES))
def test_greedy_identical_to_plain(agreeing, plain_out, tree):
    target, draft = agreeing
    prompts, plain = plain_out
    eng = spec(target, draft, tree)
    for batch in ([prompts[0]], prompts):  # batch 1, and 4 rows of different lengths
        out = eng.generate(batch, SamplingParams(max_new_tokens=48))
        for o, p in zip(out, plain):
            assert o.tokens == p.tokens
            assert sum(o.accept_lengths) >= len(o.tokens) - 1  # root token comes from the prefill
    lengths = [a for o in out for a in o.accept_lengths]
    assert max(lengths) >= min(3, TREES[tree][0] + 1) and min(lengths) == 1, "acceptance should be partial"


@pytest.mark.parametrize("tree", ["chain", "wide"])
def test_greedy_identical_with_static_shapes(agreeing, plain_out, tree):
    """The CUDA-graph layout (every step attends over the whole cache, n_slots = capacity), run eagerly."""
    target, draft = agreeing
    prompts, plain = plain_out
    out = spec(target, draft, tree, static_shapes=True).generate(prompts, SamplingParams(max_new_tokens=48))
    assert [o.tokens for o in out] == [p.tokens for p in plain]


def test_compiled_iteration_identical_to_plain(agreeing, plain_out):
    """torch.compile over the whole iteration (tree growth, verify, acceptance, commit, the draft's extension), run
    without graphs on the CPU: the tokens are plain decoding's."""
    target, draft = agreeing
    prompts, plain = plain_out
    eng = spec(target, draft, "tree", static_shapes=True, compile=True)
    out = eng.generate(prompts, SamplingParams(max_new_tokens=48))
    assert [o.tokens for o in out] == [p.tokens for p in plain]


@pytest.mark.parametrize("chunk", [1, 8])
def test_fallback_mid_answer_gives_plain_tokens(agreeing, plain_out, chunk, monkeypatch):
    """A fallback decided inside a call; after it the session decodes as PlainGenerator does (chunks of
    steps per host read under CUDA graphs, run eagerly here), over the engine's own cache and state."""
    import eaglet.speculative.policy as policy

    monkeypatch.setattr(policy, "WINDOW", 4)
    monkeypatch.setattr(policy, "LONG_WINDOW", 8)  # decide within the call
    target, draft = agreeing
    prompts, plain = plain_out
    eng = SpecEngine(target, draft, CONTEXT, *TREES["chain"], adaptive=True, log=lambda _: None, chunk=chunk)
    eng.policy.plain_step_s[len(prompts)] = 1e-9  # plain steps cost nothing: speculation loses
    out = eng.generate(prompts, SamplingParams(max_new_tokens=48))
    assert eng.policy.tree(len(prompts)) is None
    assert [o.tokens for o in out] == [p.tokens for p in plain]
    assert all(0 < len(o.accept_lengths) < len(o.tokens) - 1 for o in out), "some tokens came after the fallback"
    assert (eng._chunks.get(len(prompts)) is not None) == (chunk > 1)


@pytest.mark.parametrize("chunk", [1, 8])
def test_a_batch_that_fell_back_speculates_again_mid_answer(agreeing, plain_out, chunk, monkeypatch):
    """A server's batch under steady load never drains, so a fallback must end inside the session: after
    RETRY_PLAIN_STEPS plain steps (or chunks) each running row's caches are prefilled again over its committed
    context, its pending token kept, and the iterations resume; here speculation loses each time, so the session
    goes round fallback, plain steps and resumption, and the output is still plain decoding's."""
    import eaglet.speculative.policy as policy

    monkeypatch.setattr(policy, "WINDOW", 4)
    monkeypatch.setattr(policy, "LONG_WINDOW", 8)
    monkeypatch.setattr(policy, "RETRY_PLAIN_STEPS", 2)
    target, draft = agreeing
    prompts, plain = plain_out
    logs = []
    eng = SpecEngine(target, draft, CONTEXT, *TREES["chain"], adaptive=True, log=logs.append, chunk=chunk)
    eng.policy.plain_step_s[len(prompts)] = 1e-9  # plain steps cost nothing: speculation loses
    out = eng.generate(prompts, SamplingParams(max_new_tokens=48))
    assert [o.tokens for o in out] == [p.tokens for p in plain]
    assert any("trying speculation again" in line for line in logs)
    assert max(len(o.accept_lengths) for o in out) > 8, "iterations past the first fallback (after 8 iterations)"


def test_greedy_identical_with_a_frequency_cut_vocabulary(agreeing, plain_out):
    """A frequency-ordered draft served with the prefix of its vocabulary (``--draft-vocab``; a CPU's default):
    tokens past the cut are never proposed, the rest still are, and the output is plain decoding's."""
    target, echo = agreeing
    prompts, plain = plain_out
    written = torch.tensor([t for o in plain for t in o.tokens])
    order = torch.argsort(-torch.bincount(written, minlength=target.config.vocab_size), stable=True)
    draft = copy.deepcopy(echo)
    draft.config = dataclasses.replace(draft.config, vocab_by_frequency=True)
    with torch.no_grad():
        draft.lm_head.weight.copy_(echo.lm_head.weight[order])  # the same draft, its vocabulary by frequency
    draft.set_vocab(order)
    n = written.unique().numel() // 2  # half the tokens plain decoding wrote fall past the cut
    draft.keep_vocab(n)
    assert draft.lm_head.weight.shape[0] == n and set(draft.vocab_ids().tolist()) == set(order[:n].tolist())
    out = spec(target, draft, "tree").generate(prompts, SamplingParams(max_new_tokens=48))
    assert [o.tokens for o in out] == [p.tokens for p in plain]
    assert max(a for o in out for a in o.accept_lengths) > 1  # the kept tokens are still proposed and accepted


def test_greedy_identical_with_random_draft(target):
    """A draft that (almost) never agrees: every verify emits one token, still the plain output."""
    draft = random_draft(target, seed=5, draft_vocab=40)
    prompts = prompts_of([5, 11])
    params = SamplingParams(max_new_tokens=20)
    plain = PlainGenerator(target, CONTEXT).generate(prompts, params)
    out = spec(target, draft, "tree").generate(prompts, params)
    assert [o.tokens for o in out] == [p.tokens for p in plain]


def _reference_caches(target, draft, prompt, tokens):
    """Caches of a from-scratch prefill of prompt + tokens[:-1] (tokens[-1] pending)."""
    seq = prompt + tokens[:-1]
    tc, dc = target.model.new_cache(1, CONTEXT), draft.new_cache(1, CONTEXT)
    _, aux = prefill(target.model, tc, [seq], draft.config.capture.points)
    draft_prefill(draft, target.model.embed, dc, [seq], aux, torch.tensor(tokens[-1:]))
    return tc, dc


@torch.no_grad()
@pytest.mark.parametrize("tree", ["chain", "tree"])
def test_caches_after_partial_acceptance_match_a_fresh_prefill(agreeing, tree):
    """Rollback: after many partially accepted trees, both caches hold exactly the committed tokens.

    The target cache must equal a prefill of the emitted sequence, and the draft cache the
    anchors computed from real target features (not the tree's draft-fed entries).
    """
    target, draft = agreeing
    prompts = prompts_of([6, 13], seed=4)
    eng = spec(target, draft, tree)
    out = eng.generate(prompts, SamplingParams(max_new_tokens=40))
    # The last iteration commits its whole accepted path on the device before the host cuts
    # the output at the limit; a longer greedy run holds the tokens past the cut.
    longer = spec(target, draft, tree).generate(prompts, SamplingParams(max_new_tokens=60))
    tcache, dcache, _ = eng._caches[2]
    for row, (p, o, lo) in enumerate(zip(prompts, out, longer)):
        n = int(tcache.lens[row])
        assert lo.tokens[: len(o.tokens)] == o.tokens
        assert n == int(dcache.lens[row]) and len(p) < n <= len(p) + len(o.tokens) + TREES[tree][0]
        ref_t, ref_d = _reference_caches(target, draft, p, lo.tokens[: n - len(p) + 1])
        for got, ref in ((tcache, ref_t), (dcache, ref_d)):
            for a, b in zip(got.k + got.v, ref.k + ref.v):
                torch.testing.assert_close(a[row, :, :n], b[0, :, :n], atol=1e-4, rtol=1e-4)


def _with_eos(target, eos: int):
    return dataclasses.replace(target, config=dataclasses.replace(target.config, eos_token_ids=(eos,)))


@pytest.mark.parametrize("tree", ["chain", "tree"])
def test_stops_match_plain(agreeing, plain_out, tree):
    target, draft = agreeing
    prompts, plain = plain_out
    toks = plain[1].tokens
    cases = [
        (_with_eos(target, toks[20]), SamplingParams(max_new_tokens=48)),  # EOS
        (target, SamplingParams(max_new_tokens=48, stop=(target.tokenizer.decode(toks[14:16]),))),  # stop string
        (target, SamplingParams(max_new_tokens=17)),  # length
    ]
    for (tgt, params), reason in zip(cases, ["stop", "stop", "length"]):
        ref = PlainGenerator(tgt, CONTEXT).generate(prompts, params)
        got = spec(tgt, draft, tree).generate(prompts, params)
        assert [(o.tokens, o.finish_reason) for o in got] == [(o.tokens, o.finish_reason) for o in ref]
        assert got[1].finish_reason == reason


def test_eos_is_dropped_and_row_stops(agreeing, plain_out):
    target, draft = agreeing
    prompts, plain = plain_out
    eos = plain[1].tokens[20]
    out = spec(_with_eos(target, eos), draft, "tree").generate(prompts, SamplingParams(max_new_tokens=48))
    assert out[1].finish_reason == "stop" and eos not in out[1].tokens
    assert out[1].tokens == plain[1].tokens[: plain[1].tokens.index(eos)]


def test_context_limit_matches_plain(agreeing):
    target, draft = agreeing
    prompts = prompts_of([30, 8], seed=7)
    params = SamplingParams(max_new_tokens=200)
    ref = [PlainGenerator(target, 48).generate([p], params)[0] for p in prompts]  # batch 1: see the report
    got = SpecEngine(target, draft, 48, *TREES["tree"], adaptive=False, log=lambda _: None).generate(prompts, params)
    assert [o.tokens for o in got] == [o.tokens for o in ref]
    assert len(got[0].tokens) == 48 - 30


def test_streaming_matches_tokens(agreeing):
    target, draft = agreeing
    seen = {0: [], 1: []}
    out = spec(target, draft, "tree").generate(prompts_of([5, 9]), SamplingParams(max_new_tokens=30),
                                               on_token=lambda r, t: seen[r].append(t))
    assert [seen[0], seen[1]] == [o.tokens for o in out]


def test_policy_falls_back_to_plain_when_slower(target):
    """With a draft that never agrees, the automatic policy measures, judges over calls and drops to plain."""
    draft = random_draft(target, seed=9, draft_vocab=40)
    logs = []
    eng = SpecEngine(target, draft, CONTEXT, log=logs.append)
    prompts = prompts_of([5, 8])
    params = SamplingParams(max_new_tokens=40)
    plain = [o.tokens for o in PlainGenerator(target, CONTEXT).generate(prompts, params)]
    for _ in range(3):  # one call's ~40 iterations are not enough evidence; two calls' are
        assert [o.tokens for o in eng.generate(prompts, params)] == plain
    assert "automatic for cpu batch 2" in logs[0]
    assert any("switching to plain decoding" in m for m in logs)
    assert eng.policy.tree(2) is None


@pytest.mark.parametrize("kw, match", [
    (dict(num_steps=3), "missing: --tree-topk, --num-draft-tokens"),
    (dict(num_steps=3, topk=2), "missing: --num-draft-tokens"),
    (dict(num_steps=3, topk=1, num_draft_tokens=5), "topk=1"),
    (dict(num_steps=2, topk=50, num_draft_tokens=10), "topk=50 exceeds the draft vocabulary"),
])
def test_engine_config_errors(target, kw, match):
    draft = random_draft(target, draft_vocab=40)
    with pytest.raises(EagletError, match=match):
        SpecEngine(target, draft, CONTEXT, log=lambda _: None, **kw)


def test_draft_for_another_target_is_refused(target, tmp_path):
    from tests.speculative.conftest import tiny_target

    other = tiny_target(tmp_path, vocab=64, layers=4)
    with pytest.raises(EagletError, match="draft was built for a target"):
        SpecEngine(target, random_draft(other), CONTEXT, log=lambda _: None)


def test_prompt_longer_than_context(agreeing):
    target, draft = agreeing
    with pytest.raises(EagletError, match="the prompt has 200 tokens"):
        spec(target, draft, "chain").generate([[1] * 200], SamplingParams())


def test_policy_judges_on_evidence():
    """Costs measured once, acceptance over a window across calls, skips, fallback and retry."""
    from eaglet.speculative.policy import LONG_WINDOW, RETRY_PLAIN_STEPS, WINDOW, BatchPolicy
    from eaglet.speculative.tree import TreeConfig

    logs = []
    pol = BatchPolicy("cuda", None, True, logs.append)
    ladder = pol.ladder(3)
    assert pol.tree(3) == TreeConfig(5, 4, 24) and "automatic for cuda batch 3" in logs[0]
    pol.plain_step_s[3] = 1.0
    pol.iteration_s.update({(3, ladder[0]): 2.5, (3, ladder[1]): 1.9, (3, ladder[2]): 1.2})
    pol.start_call(3)
    for _ in range(LONG_WINDOW - 1):  # one call: not judged before LONG_WINDOW iterations
        pol.observe(3, 6, 3)  # accept length 2: 2 / 2.5 = 0.8x
    assert pol.tree(3) == ladder[0]
    pol.start_call(3)
    pol.observe(3, 6, 3)
    # 0.8x: step down; the next tree (1.9 plain steps) could reach 2 / 1.9 > 1, so it is tried.
    assert pol.tree(3) == ladder[1] and "ran at 0.80x plain decoding (accept length 2.00" in logs[-1]
    pol.start_call(3)
    pol.start_call(3)
    for _ in range(WINDOW):  # accept length 1.5 at 1.9 plain steps: 0.79x; 1.5 / 1.2 > 1: try the third
        pol.observe(3, 9, 6)
    assert pol.tree(3) == ladder[2]
    pol.start_call(3)
    pol.start_call(3)
    for _ in range(WINDOW):  # 1.5 / 1.2 = 1.25x: stays
        pol.observe(3, 9, 6)
    assert pol.tree(3) == ladder[2]
    # A tree whose cost the acceptance seen cannot pay is skipped without running it.
    for cfg in ladder[3:]:
        pol.iteration_s[(3, cfg)] = 1.6
    # 1.1 / 1.2 < 1 once the window holds these alone: down; 1.1 / 1.6 < 1 for every smaller tree: plain
    for _ in range(LONG_WINDOW + WINDOW):
        pol.observe(3, 11, 10)
    assert pol.tree(3) is None and logs[-1].endswith("switching to plain decoding")
    assert "could reach 0.69x at most" in logs[-1]
    for _ in range(RETRY_PLAIN_STEPS):
        pol.observe_plain(3)
    pol.start_call(3)
    assert pol.tree(3) == ladder[0] and "trying speculation again" in logs[-1]

    # Wall time decides, not the replay's: timed at 1.2 plain steps, the tree ran at 2.0 (host work per
    # iteration); accept length 1.5 over 2.0 steps is 0.75x plain decoding.
    timed = BatchPolicy("cuda", None, True, logs.append)
    cfg = timed.ladder(64)[0]
    timed.plain_step_s[64], timed.iteration_s[(64, cfg)] = 1.0, 1.2
    timed.start_call(64)
    timed.start_call(64)
    with timed.paused():  # a warm-up books nothing
        for _ in range(LONG_WINDOW):
            timed.observe(64, 64, 64, seconds=9.0)
    assert timed.tree(64) == cfg and not timed._t(64).window and timed.adaptive
    for _ in range(WINDOW - 1):
        timed.observe(64, 96, 64, seconds=2.0)
    assert timed.tree(64) == cfg
    timed.observe(64, 96, 64, seconds=2.0)
    assert timed.tree(64) != cfg and "ran at 0.75x plain decoding" in logs[-1] and "took 2.00 plain steps" in logs[-1]

    fixed = BatchPolicy("cpu", TreeConfig(3, 1, 4), True, logs.append)
    assert fixed.tree(1) == TreeConfig(3, 1, 4) and logs[-1].endswith("(as given)")
    fixed.plain_step_s[1], fixed.iteration_s[(1, TreeConfig(3, 1, 4))] = 1.0, 3.0
    fixed.start_call(1)
    fixed.start_call(1)
    for _ in range(WINDOW):
        fixed.observe(1, 1, 1)
    assert fixed.tree(1) is None and logs[-1].endswith("switching to plain decoding")
    off = BatchPolicy("cpu", None, False, logs.append)
    for _ in range(LONG_WINDOW):
        off.observe(1, 1, 1)
    assert off.tree(1) == TreeConfig(5, 2, 8)


def test_policy_steps_down_only_to_trees_already_built(target):
    """A compiling engine's step down skips trees not yet compiled (a build stalls every running row
    for about a minute on an H200), landing on a built one or on plain decoding."""
    from eaglet.speculative.policy import WINDOW, BatchPolicy
    from eaglet.speculative.tree import TreeConfig

    logs, built = [], set()
    pol = BatchPolicy("cuda", None, True, logs.append, ready=lambda b, cfg: (b, cfg) in built)
    ladder = pol.ladder(3)
    built.add((3, ladder[2]))
    pol.plain_step_s[3] = 1.0
    pol.iteration_s[(3, ladder[0])] = 2.5
    pol.start_call(3)
    pol.start_call(3)
    for _ in range(WINDOW):  # accept length 2 at 2.5 plain steps: 0.8x
        pol.observe(3, 6, 3)
    assert pol.tree(3) == ladder[2]
    assert logs[-1].endswith(f"switching to {ladder[2].describe()} (not built, so skipped: {ladder[1].describe()})")
    pol.iteration_s[(3, ladder[2])] = 2.5
    pol.start_call(3)
    for _ in range(WINDOW):
        pol.observe(3, 6, 3)
    assert pol.tree(3) is None and "switching to plain decoding (not built, so skipped: " in logs[-1]

    # The engine's word: without torch.compile every tree is ready; compiling, only those built.
    draft = random_draft(target, draft_vocab=40)
    cfg = TreeConfig(3, 1, 4)
    assert SpecEngine(target, draft, CONTEXT, log=lambda _: None, compile=False).policy.ready(2, cfg)
    eng = SpecEngine(target, draft, CONTEXT, log=lambda _: None, compile=True)
    assert not eng.policy.ready(2, cfg)
    eng._iterations[(2, cfg, None)] = object()  # what _iteration stores once built (no compile needed here)
    assert eng.policy.ready(2, cfg) and not eng.policy.ready(1, cfg)


@pytest.mark.parametrize("tree, static, seed, plen", [("wide", True, 2, 55), ("chain", False, 4, 58),
                                                      ("tree", False, 5, 40)])
def test_a_row_reaching_the_context_commits_no_further(agreeing, tree, static, seed, plen):
    """The row that fills the context ends while the other runs on; its last path is not committed past the
    context (its later trees, grown above its length, stay inside the cache's margin: these cases wrote
    past the cache before), and both rows decode what they decode alone."""
    target, draft = agreeing
    ctx, params = 64, SamplingParams(max_new_tokens=200)
    prompts = prompts_of([plen, 5], seed=seed)
    alone = [PlainGenerator(target, ctx).generate([p], params)[0].tokens for p in prompts]
    eng = SpecEngine(target, draft, ctx, *TREES[tree], adaptive=False, log=lambda _: None, static_shapes=static)
    out = eng.generate(prompts, params)
    assert [o.tokens for o in out] == alone and len(out[0].tokens) == ctx - plen
    assert int(eng._caches[2][0].lens.max()) <= ctx


def test_fallback_shares_plain_decodings_geometry(agreeing):
    """The engine's target cache is PlainGenerator's (context + TREE_SLACK) for every tree of the default
    ladders, so its fallback step has plain decoding's shapes (one compile serves both); a tree whose margin
    exceeds the slack gets a larger cache, not a wrong one."""
    target, draft = agreeing
    plain = PlainGenerator(target, CONTEXT)
    plain.generate(prompts_of([5]), SamplingParams(max_new_tokens=2))
    for device, batch in (("cuda", 1), ("cpu", 1), ("cuda", 64)):
        eng = SpecEngine(target, draft, CONTEXT, log=lambda _: None)
        eng.policy.device_type = device
        tcache, dcache, _ = eng._cache(batch)
        assert tcache.capacity == plain._caches[1].capacity == CONTEXT + TREE_SLACK
        assert dcache.capacity == tcache.capacity
    big = SpecEngine(target, draft, CONTEXT, 2, 40, TREE_SLACK + 16, adaptive=False, log=lambda _: None)
    assert big._cache(1)[0].capacity == CONTEXT + TREE_SLACK + 16
    out = big.generate(prompts_of([5]), SamplingParams(max_new_tokens=8))
    assert out[0].tokens == plain.generate(prompts_of([5]), SamplingParams(max_new_tokens=8))[0].tokens



@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A repeat-prone target of 384 tokens (hidden 64: enough rows a dimension to fit ``extend_vocab``'s map), its
    echo draft, and plain decoding's output."""
    target = repeat_prone(tiny_target(tmp_path_factory.mktemp("wide"), vocab=384))
    prompts = prompts_of([7, 12, 3, 9])
    return target, echo_draft(target), prompts, PlainGenerator(target, CONTEXT).generate(
        prompts, SamplingParams(max_new_tokens=48))


def test_an_extended_vocabulary_proposes_again_what_the_draft_lacked(wide):
    """The echo draft without the 4 tokens plain decoding writes most, then ``extend_vocab``: its head is the
    target's, so the map is the identity and the missing rows come back as the target's; the trained rows and their
    order stay first, the output is plain decoding's, and the lacking tokens are proposed and accepted again."""
    target, echo, prompts, plain = wide
    vocab = target.config.vocab_size
    written = torch.tensor([t for o in plain for t in o.tokens])
    order = torch.argsort(torch.bincount(written, minlength=vocab), stable=True)  # the most written last
    draft = copy.deepcopy(echo)
    draft.config = dataclasses.replace(draft.config, vocab_by_frequency=True)
    with torch.no_grad():
        draft.lm_head.weight.copy_(echo.lm_head.weight[order])
    draft.set_vocab(order)
    draft.keep_vocab(vocab - 4)
    kept, trained_rows = draft.vocab_ids(), draft.lm_head.weight.clone()
    lacking = spec(target, draft, "tree").generate(prompts, SamplingParams(max_new_tokens=48))

    assert draft.extend_vocab(target.model.lm_head.weight) > 0.999
    assert draft.config.draft_vocab_size == vocab and draft.t2d.all()
    assert torch.equal(draft.vocab_ids()[: vocab - 4], kept)
    assert sorted(draft.vocab_ids().tolist()) == list(range(vocab))
    assert torch.equal(draft.lm_head.weight[: vocab - 4], trained_rows)
    added = draft.vocab_ids()[vocab - 4:]
    assert sorted(added.tolist()) == sorted(order[-4:].tolist())
    torch.testing.assert_close(draft.lm_head.weight[vocab - 4:], target.model.lm_head.weight[added], atol=1e-4,
                               rtol=1e-4)
    out = spec(target, draft, "tree").generate(prompts, SamplingParams(max_new_tokens=48))
    assert [o.tokens for o in out] == [p.tokens for p in plain] == [o.tokens for o in lacking]
    assert sum(len(o.accept_lengths) for o in out) < sum(len(o.accept_lengths) for o in lacking), "fewer verifies"


def test_extend_vocab_refuses_what_it_cannot_map(wide):
    """A head unrelated to the target's, too few rows to fit, a whole vocabulary, a shard: one sentence each, the
    draft unchanged."""
    target, echo, _, _ = wide
    head = target.model.lm_head.weight
    unrelated = random_draft(target, seed=3, draft_vocab=300)
    ids = unrelated.vocab_ids().clone()
    with pytest.raises(EagletError, match=r"unrelated to the target's \(the map between them fits at R\^2 0\.\d+"):
        unrelated.extend_vocab(head)
    assert unrelated.config.draft_vocab_size == 300 and torch.equal(unrelated.vocab_ids(), ids)
    with pytest.raises(EagletError, match="too few to fit a map of 64 dimensions"):
        random_draft(target, draft_vocab=200).extend_vocab(head)
    with pytest.raises(EagletError, match="whole one already"):
        copy.deepcopy(echo).extend_vocab(head)
    with pytest.raises(EagletError, match=r"the target's LM head given is \(192, 64\), not \[384, 64\]"):
        random_draft(target, draft_vocab=300).extend_vocab(head[:192])
