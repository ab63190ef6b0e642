"""Tree growth: structure (parents, depth, masks, children), best-first selection, draft attention, errors."""

from __future__ import annotations

import pytest
import torch

from eaglet.errors import EagletError
from eaglet.sampling import SamplingParams
from eaglet.speculative.drafting import draft_prefill
from eaglet.speculative.tree import TreeConfig, ancestor_mask, argmax, argmax_chunk, best_first, build_tree, top_k
from eaglet.speculative.verify import prefill
from tests.speculative.conftest import random_draft

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def setup(target):
    """Target and draft caches after prefill of two prompts of different lengths."""
    draft = random_draft(target, seed=3)
    prompts = [[5, 9, 2, 33, 7, 1, 60], [4, 8, 15]]
    tc, dc = target.model.new_cache(2, 128), draft.new_cache(2, 128)
    with torch.no_grad():
        logits, aux = prefill(target.model, tc, prompts, draft.config.capture.points)
        roots = logits.argmax(-1)
        seed = draft_prefill(draft, target.model.embed, dc, prompts, aux, roots)
    return draft, tc, dc, seed, roots


def grow(target, setup, cfg, params=GREEDY, gen_seed=0):
    draft, _, dc, seed, roots = setup
    uniform = None
    if not params.greedy:
        g = torch.Generator().manual_seed(gen_seed)
        uniform = torch.rand(seed.shape[0], cfg.noise_rows, draft.config.draft_vocab_size, generator=g)
    with torch.no_grad():
        return build_tree(draft, target.model.embed, seed, roots, dc, cfg, params, uniform)


@pytest.mark.parametrize("cfg", [TreeConfig(4, 1, 5), TreeConfig(3, 3, 10), TreeConfig(4, 4, 30),
                                 TreeConfig(3, 2, 11), TreeConfig(1, 5, 6)])
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_structure(target, setup, cfg, params):
    t = grow(target, setup, cfg, params)
    b, n = t.tokens.shape
    assert n == cfg.num_draft_tokens and t.children.shape == (b, n, cfg.topk)
    assert (t.tokens[:, 0] == setup[4]).all() and (t.depth[:, 0] == 0).all() and (t.parents[:, 0] == 0).all()
    for r in range(b):
        par, dep = t.parents[r].tolist(), t.depth[r].tolist()
        for i in range(1, n):
            assert par[i] < i, "topological order"
            assert dep[i] == dep[par[i]] + 1 and 1 <= dep[i] <= cfg.num_steps
        # mask: self and ancestors exactly
        for i in range(n):
            anc, j = {i}, i
            while j:
                j = par[j]
                anc.add(j)
            assert set(torch.nonzero(t.mask[r, i]).flatten().tolist()) == anc
        # children: each node's chosen children in proposal order, a prefix of the slots
        for i in range(n):
            kids = t.children[r, i].tolist()
            real = [c for c in kids if c >= 0]
            assert kids == real + [-1] * (len(kids) - len(real))
            assert real == sorted(c for c in range(1, n) if par[c] == i)
            toks = [t.tokens[r, c].item() for c in real]
            assert len(set(toks)) == len(toks), "siblings are distinct tokens"
    assert torch.equal(ancestor_mask(t.parents, cfg.num_steps), t.mask)
    if cfg.topk == 1:
        assert t.depth.tolist() == [list(range(n))] * b


def test_positions_are_lens_plus_depth(target, setup):
    t = grow(target, setup, TreeConfig(3, 3, 10))
    tc = setup[1]
    meta = tc.tree_meta(t.depth, t.mask)
    assert torch.equal(meta.positions, tc.lens.view(-1, 1) + t.depth)
    assert torch.equal(meta.slots, tc.lens.view(-1, 1) + torch.arange(10))


def chain_logits(target, setup, row: int, tokens: list[int]) -> torch.Tensor:
    """Draft log-probs after feeding ``tokens`` (depth 1..) as a plain causal chain from the anchor."""
    draft, _, dc, seed, _ = setup
    cache = draft.new_cache(1, dc.capacity)
    cache.k[0].copy_(dc.k[0][row: row + 1])
    cache.v[0].copy_(dc.v[0][row: row + 1])
    cache.lens.copy_(dc.lens[row: row + 1])
    out = seed[row: row + 1]
    for tok in tokens:
        out = draft(out.view(1, 1, -1), target.model.embed(torch.tensor([[tok]])), cache.append_meta(1), cache)[:, 0]
        cache.advance(1)
    return torch.log_softmax(draft.logits(out)[0].float(), -1)


def path_tokens(tree, row: int, node: int) -> list[int]:
    return tree.tokens[row, torch.nonzero(tree.mask[row, node]).flatten()].tolist()[1:]


@torch.no_grad()
def test_children_are_the_drafts_top_k_along_each_path(target, setup):
    """Every expanded node's children equal the draft's top-k computed along its path as a plain chain.

    The chain reference writes each ancestor's draft K/V with causal append metadata, so this
    checks the tree's draft masks, slots and positions against the training semantics.
    """
    draft = setup[0]
    cfg = TreeConfig(4, 3, 16)
    t = grow(target, setup, cfg)
    checked = 0
    for r in range(t.tokens.shape[0]):
        for i in range(t.tokens.shape[1]):
            kids = [c for c in t.children[r, i].tolist() if c >= 0]
            if kids:
                lp = chain_logits(target, setup, r, path_tokens(t, r, i))
                top = draft.to_target_ids(lp.topk(cfg.topk).indices).tolist()
                assert [t.tokens[r, c].item() for c in kids] == top[: len(kids)]
                checked += 1
    assert checked >= 6


@torch.no_grad()
def test_best_first_selection_greedy(target, setup):
    """The chosen nodes are the candidates with the highest cumulative draft log-probability."""
    draft = setup[0]
    t2d = {int(t): d for d, t in enumerate(draft.to_target_ids(torch.arange(draft.config.draft_vocab_size)))}
    small, full = grow(target, setup, TreeConfig(3, 3, 8)), grow(target, setup, TreeConfig(3, 3, 22))
    for r in range(2):  # 22 = every candidate (1 + 3 + 2*9), so ``full`` is the whole pool
        score = {}
        for i in range(1, 22):
            toks = path_tokens(full, r, i)
            score[tuple(toks)] = sum(chain_logits(target, setup, r, toks[:d])[t2d[tok]].item()
                                     for d, tok in enumerate(toks))
        chosen = {tuple(path_tokens(small, r, i)) for i in range(1, 8)}
        best = sorted(score, key=lambda k: (-score[k], len(k)))[:7]
        assert chosen == set(best)


@pytest.mark.parametrize("cfg", [TreeConfig(4, 1, 5), TreeConfig(3, 3, 10), TreeConfig(4, 4, 30)])
def test_greedy_proposal_without_log_softmax(target, setup, monkeypatch, cfg):
    """Greedy growth from the logits (top k, then only those shifted by the log-sum-exp; a chain's scores
    left at 0) builds the tree that ranking the whole log-softmax builds."""
    import eaglet.speculative.tree as tree_mod

    fast = grow(target, setup, cfg)

    def by_log_softmax(logits, k, params, uniform):
        values, ids = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
        return ids, values, None

    monkeypatch.setattr(tree_mod, "propose", by_log_softmax)
    ref = grow(target, setup, cfg)
    for name in ("tokens", "parents", "depth", "mask", "valid", "children"):
        assert torch.equal(getattr(fast, name), getattr(ref, name)), name


@pytest.mark.parametrize("cfg", [TreeConfig(4, 1, 5), TreeConfig(6, 1, 7), TreeConfig(1, 1, 2)])
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_chain_growth_builds_the_general_tree(target, setup, cfg, params):
    """A chain (topk 1) grown without scores or selection is the tree the general growth builds, q included."""
    import eaglet.speculative.tree as tree_mod

    def via(grow):
        draft, _, dc, seed, roots = setup
        uniform = None
        if not params.greedy:
            uniform = torch.rand(seed.shape[0], cfg.noise_rows, draft.config.draft_vocab_size,
                                 generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            return grow(draft, target.model.embed, seed, roots, dc, cfg, params, uniform)

    chain, general = via(tree_mod.grow_chain), via(tree_mod.grow_tree)
    for name in ("tokens", "parents", "depth", "mask", "valid", "children"):
        assert torch.equal(getattr(chain, name), getattr(general, name)), name
    assert (chain.q is None) == params.greedy
    if chain.q is not None:
        assert torch.equal(chain.q, general.q)


def test_sampled_children_follow_draft_distribution(target, setup):
    """Depth-1 children over many seeds: the first child's frequency matches q (Gumbel-max)."""
    draft, _, _, seed, _ = setup
    with torch.no_grad():
        q = torch.softmax(draft.logits(seed[0]).float(), -1)
    q_target = torch.zeros(target.config.vocab_size).index_add_(
        0, draft.to_target_ids(torch.arange(q.numel())), q)
    counts = torch.zeros_like(q_target)
    for s in range(300):
        t = grow(target, setup, TreeConfig(1, 4, 5), SAMPLED, gen_seed=s)
        counts[t.tokens[0, t.children[0, 0, 0]]] += 1
    top = q_target.argmax()
    assert abs(counts[top] / 300 - q_target[top]) < 0.1


@pytest.mark.parametrize("values, match", [
    ((0, 2, 3), "--num-steps must be a positive integer, got 0"),
    ((3, -1, 4), "--tree-topk must be a positive integer, got -1"),
    ((3, 2, 0), "--num-draft-tokens must be a positive integer, got 0"),
    ((5, 1, 8), r"topk=1 .* num_steps=5 .* must be 6 .* got num_draft_tokens=8"),
    ((5, 1, 4), r"topk=1 .* num_steps=5 .* must be 6 .* got num_draft_tokens=4"),
    ((3, 2, 12), r"num_draft_tokens=12 exceeds the 11 nodes that num_steps=3 and topk=2"),
    ((6, 4, 5), r"num_draft_tokens=5 reaches depth 4 at most, below num_steps=6"),
    ((1, 1, 1), r"topk=1 .* must be 2"),
    ((2, 3, 1), r"num_draft_tokens=1 verifies no draft token"),
])
def test_config_errors(values, match):
    with pytest.raises(EagletError, match=match):
        TreeConfig(*values)


def test_config_reachable():
    assert TreeConfig(3, 2, 11).reachable == 11 and TreeConfig(5, 1, 6).reachable == 6
    assert TreeConfig(1, 8, 9).region == 0 and TreeConfig(4, 3, 10).region == 9


@pytest.mark.parametrize("k,chunk,v", [(1, None, 1000), (8, 64, 1024), (4, 128, 24576), (8, 64, 1000), (8, 64, 128)])
def test_top_k_is_torch_topk(k, chunk, v):
    """The two-stage top-k (and k = 1 as a max) gives torch.topk's values, largest first, and indices that hold
    them; the last two cases (V not a multiple of the chunk, V too short) take torch.topk itself."""
    g = torch.Generator().manual_seed(v + k)
    x = torch.randn(3, 5, v, generator=g)  # distinct values: the indices are unique too
    x[0, 0, :7] = float("-inf")  # a draft's zero-probability tokens
    values, indices = top_k(x, k, chunk)
    ref = x.topk(k, dim=-1)
    assert values.shape == indices.shape == (3, 5, k)
    assert torch.equal(values, ref.values)
    assert torch.equal(indices, ref.indices)
    assert torch.equal(x.gather(-1, indices), values)


@pytest.mark.parametrize("chunk,v", [(64, 1024), (128, 24576), (64, 1000), (64, 128)])
def test_argmax_is_torch_argmax(chunk, v):
    """The two-reduction argmax gives torch's index, the first of ties (values drawn from a few integers, so
    rows hold many ties, some across chunks), rows of -inf included; the last two cases take torch's own."""
    g = torch.Generator().manual_seed(v)
    x = torch.randint(0, 5, (3, 5, v), generator=g).float()
    x[0, 0] = float("-inf")
    x[1, 2, :chunk] = -1.0  # the row's max only in later chunks
    got = argmax(x, chunk)
    assert got.shape == (3, 5) and torch.equal(got, x.argmax(-1))


def test_argmax_chunk_is_the_largest_dividing_the_vocabulary():
    """SmolLM2's 49,152 and its 24,576-token draft vocabulary in 1,024s, Llama 3's 128,256 (2^8 x 501) in 256s;
    a vocabulary no chunk divides takes torch's argmax (None)."""
    assert [argmax_chunk(v) for v in (49152, 24576, 32000, 128256, 1000)] == [1024, 1024, 256, 256, None]


@pytest.mark.parametrize("compiled", [False, True])
def test_best_first_is_the_stable_sort_selection(compiled):
    """The kept entries are a stable descending sort's first ``count``, in index order: scores drawn from a few
    integers (ties everywhere) and some -inf (a sampled pool's draws outside q's support), eager and compiled."""
    select = torch.compile(best_first, dynamic=False) if compiled else best_first
    g = torch.Generator().manual_seed(7)
    for b, m, count in [(1, 328, 47), (3, 40, 9), (2, 9, 9), (4, 100, 1)]:
        scores = torch.randint(-4, 4, (b, m), generator=g).float()
        scores[torch.rand(b, m, generator=g) < 0.1] = float("-inf")
        want = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :count].sort(dim=1).values
        assert torch.equal(select(scores, count), want)
