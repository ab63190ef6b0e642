"""The capture-point search's verdict from given per-anchor scores (the scoring itself is tested end to end)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

import eaglet.doctor.search as search
from eaglet.doctor.report import FAIL, WARN

CANDS = [("declared", (1, 2, 4)), ("point 0 for 4", (1, 2, 0))]


def _judge(monkeypatch, acc: dict, ce: dict, n: int = 60):
    """Run check_search where candidate ``label`` hits with rate acc[label] and has loss ce[label] (+ noise)."""
    gen = torch.Generator().manual_seed(0)
    monkeypatch.setattr(search, "select_points", lambda aux, captured, pts, hidden: pts)

    def scores(draft, pts, inp, prompt_lens):
        label = next(lab for lab, p in CANDS if p == pts)
        hit = torch.rand(n, generator=gen) < acc[label]
        return hit, ce[label] + 0.1 * torch.randn(n, generator=gen)

    monkeypatch.setattr(search, "step0_scores", scores)
    return search.check_search(None, SimpleNamespace(aux=None), (0, 1, 2, 4), 8, torch.tensor([4]), CANDS)


def test_a_clearly_better_set_fails_a_trained_draft(monkeypatch):
    chk = _judge(monkeypatch, {"declared": 0.3, "point 0 for 4": 0.6}, {"declared": 3.0, "point 0 for 4": 2.0})
    assert chk.status == FAIL and "[1, 2, 0]" in chk.summary


def test_an_untrained_draft_only_warns_whatever_the_losses(monkeypatch):
    # No set predicts the target (acc 0): a lower loss of another set is not evidence of wrong points.
    chk = _judge(monkeypatch, {"declared": 0.0, "point 0 for 4": 0.0}, {"declared": 14.6, "point 0 for 4": 13.3})
    assert chk.status == WARN and any("cannot tell the sets apart" in p for p in chk.problems), chk.problems
