"""scripts/vocab_coverage.py: answer tokens outside a draft's vocabulary, read from the draft's own d2t."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from eaglet.capture import CaptureSpec
from eaglet.chat import encode_text
from eaglet.draft.checkpoint import save_draft
from eaglet.draft.model import DraftConfig, Eagle3Draft
from eaglet.loading.hf import read_config
from eaglet.loading.target import load_tokenizer
from tests.train.helpers import make_tiny_target_dir

_spec = importlib.util.spec_from_file_location(
    "vocab_coverage", Path(__file__).resolve().parents[1] / "scripts" / "vocab_coverage.py")
vocab_coverage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vocab_coverage)


def test_counts_follow_the_drafts_order_and_cuts(tmp_path):
    target = make_tiny_target_dir(tmp_path / "target")
    cfg = read_config(target)
    # 128 draft tokens listed from the highest target id down: draft id i is target id 259 - i.
    draft = Eagle3Draft(DraftConfig.for_target(cfg, CaptureSpec.eagle3_default(cfg.num_layers), 128))
    draft.set_vocab(torch.arange(259, 131, -1))
    save_draft(draft, tmp_path / "draft", dtype=torch.float32)
    order = vocab_coverage.draft_order(tmp_path / "draft", cfg.num_layers)
    assert order == list(range(259, 131, -1))

    tok = load_tokenizer(target)
    texts = {"a": ["hello world", "naïve café ☃"], "b": ["ÿ€ and more"]}
    report = {"prompts": [{"set": s, "methods": {"spec": {"text": t}}} for s, ts in texts.items() for t in ts]}
    sizes, counts = vocab_coverage.outside(report, order, lambda t: encode_text(tok, t), [64, 500])
    assert sizes == [128, 64]  # a cut at or above the whole vocabulary is no cut
    for name, ts in texts.items():
        ids = [i for t in ts for i in encode_text(tok, t)]
        # outside the whole: below 132; outside the 64 most frequent: below 259 - 63 = 196
        assert counts[name] == [len(ids), sum(i < 132 for i in ids), sum(i < 196 for i in ids)]
        assert 0 < counts[name][1] < counts[name][2] < len(ids)  # each band holds some tokens


def test_breaks_place_each_verify_on_the_answer_and_count_those_ending_outside_the_vocabulary():
    order = [10, 11, 12]  # the draft's target ids, most frequent first
    encode = lambda text: [int(x) for x in text.split()]  # noqa: E731
    spec = lambda text, tokens, lengths, finish="length": {  # noqa: E731
        "spec": {"text": text, "tokens": tokens, "accept_lengths": lengths, "finish_reason": finish}}
    report = {"config": {"spec_decisions": ["tree num_steps=2 topk=2 num_draft_tokens=4 (as given)"]},
              "prompts": [
                  # the prefill's 10, then verifies of 3 (the tree's whole depth: no break), 2, 1 and 1 tokens;
                  # 13 lies outside every size but mid-run, so no break happens at it
                  {"set": "a", "methods": spec("10 11 12 10 13 11 10 12", 8, [3, 2, 1, 1])},
                  # stopped: the end-of-turn token is not in the text; its verify is counted, not placed
                  {"set": "a", "methods": spec("10 11", 3, [2], "stop")},
                  {"set": "b", "methods": spec("10 11 12", 4, [3])},  # the text encodes otherwise: left out
                  {"set": "b", "methods": {"plain": {"text": "10", "tokens": 1}}}]}  # no verifies: not counted
    stats, left_out = vocab_coverage.breaks(report, order, encode, 2)
    assert left_out == 1 and set(stats) == {"a"}
    assert stats["a"] == {"emitted": 9, "verifies": 5, "breaks": 3, "outside": 1}  # the last 12: rank 2 of 2
    assert vocab_coverage.breaks(report, order, encode, 3)[0]["a"]["outside"] == 0
    two_trees = {**report, "config": {"spec_decisions": ["tree num_steps=3 topk=1 num_draft_tokens=4 (automatic)",
                                                         "tree num_steps=4 topk=2 num_draft_tokens=10 (automatic)"]}}
    with pytest.raises(SystemExit, match="one tree"):
        vocab_coverage.breaks(two_trees, order, encode, 2)
