"""End to end: speculative sampling through SpecEngine reproduces the target's distribution.

Many rows of one prompt in one batch, three new tokens each; the empirical law of the
triple is compared with the exact one (every prefix enumerated with the target, V = 16)
by a chi-square test. The same test rejects two deliberately biased engines: one whose
tree keeps the best sampled children by their plain draft log-probability (the naive
EAGLE-2 ranking, which makes keeping a child depend on its identity), and one that forgets
the residual after a rejection.
"""

from __future__ import annotations

import pytest
import torch

import eaglet.speculative.accept as accept_mod
import eaglet.speculative.tree as tree_mod
from eaglet.sampling import SamplingParams, probs
from eaglet.speculative import SpecEngine
from tests.speculative.conftest import echo_draft, repeat_prone, tiny_target
from tests.speculative.test_accept import FAIL, PASS, chi_square_p

V, ROWS = 16, 4000
PROMPT = [3, 11, 5, 7, 2]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target = repeat_prone(tiny_target(tmp_path_factory.mktemp("v16"), vocab=V, seed=2), beta=1.0)
    return target, echo_draft(target)


@torch.no_grad()
def exact_triples(target, params: SamplingParams) -> torch.Tensor:
    """P(x1, x2, x3 | PROMPT) [V, V, V] under probs(target logits, params)."""
    model = target.model
    p1 = probs(model.logits(model(torch.tensor([PROMPT]))[0][:, -1]), params)[0]  # [V]
    ids = torch.cat([torch.tensor(PROMPT).expand(V, -1), torch.arange(V).view(V, 1)], 1)
    p2 = probs(model.logits(model(ids)[0][:, -1]), params)  # [V, V]
    ids = torch.cat([ids.repeat_interleave(V, 0), torch.arange(V).repeat(V).view(-1, 1)], 1)
    p3 = probs(model.logits(model(ids)[0][:, -1]), params).view(V, V, V)
    return p1.view(V, 1, 1) * p2.view(V, V, 1) * p3


def sample_triples(target, draft, params: SamplingParams, tree=(3, 3, 8)) -> tuple[torch.Tensor, float]:
    eng = SpecEngine(target, draft, 64, *tree, adaptive=False, log=lambda _: None)
    out = eng.generate([PROMPT] * ROWS, params)
    toks = torch.tensor([o.tokens for o in out])  # [ROWS, 3]
    counts = torch.bincount(toks[:, 0] * V * V + toks[:, 1] * V + toks[:, 2], minlength=V ** 3)
    accepted = sum(sum(a - 1 for a in o.accept_lengths) for o in out) / ROWS
    return counts, accepted


CASES = {
    "t1": SamplingParams(temperature=1.0, max_new_tokens=3, seed=1),
    "t0.8-topk5": SamplingParams(temperature=0.8, top_k=5, max_new_tokens=3, seed=2),
    "t1.2-topp0.9": SamplingParams(temperature=1.2, top_p=0.9, max_new_tokens=3, seed=3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_speculative_sampling_matches_target(pair, name):
    target, draft = pair
    params = CASES[name]
    counts, accepted = sample_triples(target, draft, params)
    assert accepted > 0.3, "the draft must be accepted often enough for the test to mean something"
    assert chi_square_p(counts, exact_triples(target, params)) > PASS


@pytest.mark.parametrize("bias", ["plain-log-q-ranking", "no-residual"])
def test_biased_engines_are_detected(pair, monkeypatch, bias):
    target, draft = pair
    params = CASES["t1"]
    if bias == "no-residual":
        monkeypatch.setattr(accept_mod, "residual", lambda p, q: p)
    else:
        original = tree_mod.propose

        def rank_by_plain_log_q(logits, k, params, uniform):
            ids, _, q = original(logits, k, params, uniform)
            return ids, torch.log(q.gather(-1, ids)), q

        monkeypatch.setattr(tree_mod, "propose", rank_by_plain_log_q)
    counts, _ = sample_triples(target, draft, params)
    assert chi_square_p(counts, exact_triples(target, params)) < FAIL
