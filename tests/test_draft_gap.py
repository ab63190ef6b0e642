"""scripts/draft_gap.py: draft step 0 scored against the target's argmax, and the anchors whose token lies outside
the draft's trained vocabulary."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import torch

_spec = importlib.util.spec_from_file_location(
    "draft_gap", Path(__file__).resolve().parents[1] / "scripts" / "draft_gap.py")
draft_gap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(draft_gap)


class Draft:
    """Step 0's output is taken as the logits themselves, over the draft's tokens ``ids`` (target ids)."""

    def __init__(self, ids: list[int]):
        self.ids = torch.tensor(ids)

    def logits(self, hidden):
        return hidden

    def to_target_ids(self, idx):
        return self.ids[idx]


def test_hits_and_the_anchors_outside_the_trained_vocabulary(monkeypatch):
    trained = torch.tensor([True, True, True, False, False, False])  # target ids 0-2 trained, 3-5 not
    # One conversation; anchors at columns 0-2 predict the target's argmax at columns 1-3: ids 1, 4 and 2.
    inp = SimpleNamespace(target_top=torch.tensor([[5, 1, 4, 2]]), target_logp=torch.zeros(1, 4, 3))
    rows, cols = torch.zeros(3, dtype=torch.long), torch.arange(3)
    as_trained = torch.tensor([[0.0, 9, 1], [5, 4, 0], [9, 0, 5]])  # best, second: 1,2 / 0,1 / 0,2
    extended = torch.cat([as_trained, torch.tensor([[0.0, 0, 0], [0, 8, 0], [0, 0, 0]])], 1)  # id 4 best for anchor 1
    samples = SimpleNamespace(labels=["writing"])

    def run(draft, hidden):
        monkeypatch.setattr(draft_gap, "step0_by_conversation", lambda t, d, s: iter([(0, inp, rows, cols, hidden)]))
        return draft_gap.score(None, draft, samples, trained)["writing"]

    cut = run(Draft([0, 1, 2]), as_trained)
    assert cut["top1"].tolist() == [True, False, False] and cut["top2"].tolist() == [True, False, True]
    assert cut["outside"].tolist() == [False, True, False]
    assert cut["p"].tolist() == [1.0, 1.0, 1.0]
    whole = run(Draft([0, 1, 2, 3, 4, 5]), extended)
    assert whole["top1"].tolist() == [True, True, False] and whole["outside"].tolist() == [False, True, False]
    row = draft_gap.row({m: whole[m][whole["outside"]] for m in ("top1", "top2", "p")})
    assert row["anchors"] == 1 and row["acc_0"] == 1.0
