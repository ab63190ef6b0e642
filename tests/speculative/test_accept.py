"""Acceptance: greedy paths, and the losslessness of recursive rejection sampling.

The statistical tests compare empirical token frequencies with the exact target
distribution through a chi-square test (cells with small expectations pooled). Each
runs next to deliberately biased samplers, which the same test must reject: that is
the evidence the test has the power to catch a wrong sampler.
"""

from __future__ import annotations

import pytest
import torch

import eaglet.speculative.accept as accept_mod
from eaglet.sampling import SamplingParams, probs
from eaglet.speculative.accept import chain_accept, greedy_accept, sample_accept, tree_accept
from eaglet.speculative.tree import Tree, ancestor_mask, propose

PASS, FAIL = 1e-3, 1e-6  # p-value thresholds: a correct sampler passes, a biased one fails


def chi_square_p(counts: torch.Tensor, expected_probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of a chi-square goodness-of-fit test, pooling cells expected below ``min_expected``."""
    counts, e = counts.double().flatten(), expected_probs.double().flatten() * counts.sum()
    small = e < min_expected
    counts = torch.cat([counts[~small], counts[small].sum().view(1)])
    e = torch.cat([e[~small], e[small].sum().view(1)])
    keep = e > 0
    stat = ((counts[keep] - e[keep]) ** 2 / e[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), stat / 2))


def two_level_tree(q1: torch.Tensor, q2: torch.Tensor, k1: int, k2: int, rows: int, gen) -> Tree:
    """Root -> k1 children drawn without replacement from q1 [V]; each child x -> k2 from q2[x] [V, V]."""
    v = q1.numel()
    logit1, logit2 = q1.log().expand(rows, v), q2.log()
    ids1, inc1, _ = propose(logit1, k1, SamplingParams(temperature=1.0), torch.rand(rows, v, generator=gen))
    ids2, inc2, _ = propose(logit2[ids1], k2, SamplingParams(temperature=1.0), torch.rand(rows, k1, v, generator=gen))
    n = 1 + k1 + k1 * k2
    tokens = torch.cat([torch.zeros(rows, 1, dtype=torch.long), ids1, ids2.reshape(rows, -1)], 1)
    parents = torch.cat([torch.zeros(rows, 1 + k1, dtype=torch.long),
                         torch.arange(1, 1 + k1).repeat_interleave(k2).expand(rows, -1)], 1)
    depth = torch.cat([torch.zeros(rows, 1), torch.ones(rows, k1), torch.full((rows, k1 * k2), 2.0)], 1).long()
    children = torch.full((rows, n, max(k1, k2)), -1)
    children[:, 0, :k1] = torch.arange(1, 1 + k1)
    for i in range(k1):
        children[:, 1 + i, :k2] = 1 + k1 + i * k2 + torch.arange(k2)
    q = torch.zeros(rows, n, v)
    q[:, 0] = q1
    q[:, 1: 1 + k1] = q2[ids1]
    valid = torch.cat([torch.ones(rows, 1 + k1, dtype=torch.bool), (inc2 > float("-inf")).reshape(rows, -1)], 1)
    valid[:, 1: 1 + k1] = inc1 > float("-inf")
    return Tree(tokens, parents, depth, ancestor_mask(parents, 2), valid, children, q)


def synthetic(v: int = 10, seed: int = 0):
    """Target logits per prefix (root: l1 [V], after token x: l2[x] [V]) and draft q's far from them."""
    g = torch.Generator().manual_seed(seed)
    l1, l2 = 1.5 * torch.randn(v, generator=g), 1.5 * torch.randn(v, v, generator=g)
    q1 = torch.softmax(1.5 * torch.randn(v, generator=g), -1)
    q2 = torch.softmax(1.5 * torch.randn(v, v, generator=g), -1)
    return l1, l2, q1, q2


def run_rrs(params: SamplingParams, k1: int, k2: int, rows: int = 30000, seed: int = 0):
    l1, l2, q1, q2 = synthetic()
    gen = torch.Generator().manual_seed(seed)
    tree = two_level_tree(q1, q2, k1, k2, rows, gen)
    logits = torch.where(tree.depth.unsqueeze(-1) == 0, l1, l2[tree.tokens])  # [B, N, V]
    k = tree.children.shape[-1]
    u_accept, u_final = torch.rand(rows, 2, k, generator=gen), torch.rand(rows, l1.numel(), generator=gen)
    acc = sample_accept(tree, logits, params, torch.arange(l1.numel()), 3, u_accept, u_final)
    return acc, acc.emitted(tree), probs(l1, params), probs(l2, params)


PARAMS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.7-topk4": SamplingParams(temperature=0.7, top_k=4),
    "t1.3-topp0.8": SamplingParams(temperature=1.3, top_p=0.8),
}


@pytest.mark.parametrize("k1, k2", [(1, 1), (3, 2), (5, 3)])
@pytest.mark.parametrize("name", list(PARAMS))
def test_rejection_sampler_is_lossless(name, k1, k2):
    """First token ~ p(root); second token, given an accepted first child x, ~ p(x)."""
    params = PARAMS[name]
    acc, em, p1, p2 = run_rrs(params, k1, k2)
    v = p1.numel()
    assert chi_square_p(torch.bincount(em[:, 0], minlength=v), p1) > PASS
    deep = acc.n_path >= 2
    x = torch.mode(em[deep, 0]).values  # the most frequent accepted first token
    sel = deep & (em[:, 0] == x)
    assert sel.sum() > 500
    assert chi_square_p(torch.bincount(em[sel, 1], minlength=v), p2[x]) > PASS
    assert 0.05 < (acc.n_path > 1).float().mean() < 0.95, "both acceptance and rejection must occur"


def _forget_residual(p, q):
    return p  # after a rejection, keep sampling from p: the classic bias


@pytest.mark.parametrize("bias", ["no-residual", "no-renormalisation"])
def test_biased_samplers_are_detected(monkeypatch, bias):
    if bias == "no-residual":
        monkeypatch.setattr(accept_mod, "residual", _forget_residual)
    else:  # rejected siblings keep their q mass: the next child's ratio uses the wrong q
        monkeypatch.setattr(accept_mod, "without", lambda q, tok: q)
    acc, em, p1, _ = run_rrs(PARAMS["t1"], 3, 2)
    assert chi_square_p(torch.bincount(em[:, 0], minlength=p1.numel()), p1) < FAIL


def test_chain_acceptance_is_the_tree_acceptance():
    """On a chain (topk 1) the prefix rule accepts what the general rule does: path, length, next token."""
    gen = torch.Generator().manual_seed(11)
    rows, n = 64, 6
    node = torch.arange(n)
    parents = (node - 1).clamp(min=0).expand(rows, n)
    tokens = torch.randint(0, 4, (rows, n), generator=gen)
    # the target agrees with the next token for a random prefix, then at random
    agree = torch.rand(rows, n, generator=gen) < 0.7
    target_ids = torch.where(agree, torch.cat([tokens[:, 1:], tokens[:, :1]], 1), torch.randint(0, 4, (rows, n),
                                                                                                 generator=gen))
    valid = torch.rand(rows, n, generator=gen) < 0.95
    tree = Tree(tokens=tokens, parents=parents, depth=node.expand(rows, n), mask=ancestor_mask(parents, n - 1),
                valid=valid, children=torch.where(node < n - 1, node + 1, -1).view(1, n, 1).expand(rows, n, 1), q=None)
    fast, general = chain_accept(tree, target_ids, n), tree_accept(tree, target_ids, n)
    assert torch.equal(fast.path, general.path) and torch.equal(fast.n_path, general.n_path)
    assert torch.equal(fast.next_token, general.next_token)
    assert 1 < len(set(fast.n_path.tolist()))  # accept lengths of several sizes were tested


def test_greedy_accepts_longest_matching_path():
    #   0 ─┬─ 1 ── 3 ── 5
    #      └─ 2 ── 4
    parents = torch.tensor([[0, 0, 0, 1, 2, 3]])
    tree = Tree(tokens=torch.tensor([[9, 4, 7, 6, 8, 2]]), parents=parents,
                depth=torch.tensor([[0, 1, 1, 2, 2, 3]]), mask=ancestor_mask(parents, 3),
                valid=torch.ones(1, 6, dtype=torch.bool), children=torch.full((1, 6, 2), -1), q=None)
    # target argmax per node: root -> 7 (node 2), node 2 -> 8 (node 4), node 4 -> 1 (bonus)
    argmax = torch.tensor([[7, 0, 8, 0, 1, 0]])
    acc = greedy_accept(tree, argmax, 4)
    assert acc.path.tolist() == [[0, 2, 4, 4]] and acc.n_path.tolist() == [3] and acc.next_token.tolist() == [1]
    assert acc.emitted(tree)[0, :3].tolist() == [7, 8, 1]
    # nothing matches: one token, the root's argmax
    acc = greedy_accept(tree, torch.tensor([[5, 0, 0, 0, 0, 0]]), 4)
    assert acc.n_path.tolist() == [1] and acc.emitted(tree)[0, :1].tolist() == [5]
    # a matching but invalid node is never accepted
    tree.valid[0, 2] = False
    assert greedy_accept(tree, argmax, 4).n_path.tolist() == [1]
