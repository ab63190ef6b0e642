"""Regeneration: the target answers its prompts; an interrupted run resumes without losing or repeating work."""

from __future__ import annotations

import json
import time

from eaglet.chat import encode_chat
from eaglet.data.prompts import read_jsonl
from eaglet.data.regenerate import regenerate
from eaglet.data.template import tokenize_conversations
from eaglet.generate import PlainGenerator
from eaglet.sampling import SamplingParams
from tests.train.helpers import prompts

PARAMS = SamplingParams(max_new_tokens=12)


def test_answers_are_the_targets_greedy_output(tiny_target, tmp_path):
    ps = prompts(10, seed=1, split="train")
    out = tmp_path / "r.jsonl"
    stats = regenerate(tiny_target, ps, out, PARAMS, batch_size=4, progress=False)
    assert stats.written == 10 and stats.done_before == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in recs) == sorted(p.id for p in ps)
    by_id = {r["id"]: r for r in recs}
    p = ps[3]
    ids = encode_chat(tiny_target.tokenizer, p.prompt())
    [alone] = PlainGenerator(tiny_target, 128).generate([ids], PARAMS)
    rec = by_id[p.id]
    assert rec["messages"][:-1] == p.prompt() and rec["messages"][-1]["role"] == "assistant"
    assert rec["messages"][-1]["content"] == tiny_target.tokenizer.decode(alone.tokens, skip_special_tokens=True)
    assert rec["split"] == "train" and rec["finish_reason"] == alone.finish_reason
    assert rec["answer_ids"] == alone.tokens  # the target's own ids, not a re-encoding of the text
    convs, bad = read_jsonl(out)  # the output is valid training data
    assert bad == 0 and all(c.has_answer for c in convs)
    # ... and training reads exactly the sequence the target produced: prompt ids, then the answer ids.
    eos = {tiny_target.tokenizer.eos_token_id}
    [t] = tokenize_conversations(tiny_target.tokenizer, [c for c in convs if c.id == p.id], eos)
    assert t.ids[: len(ids) + len(alone.tokens)] == ids + alone.tokens


def test_resume_skips_finished_and_repairs_a_torn_line(tiny_target, tmp_path):
    ps = prompts(12, seed=2)
    out = tmp_path / "r.jsonl"
    first = regenerate(tiny_target, ps[:5], out, PARAMS, batch_size=4, progress=False)
    assert first.written == 5
    with open(out, "a") as fh:  # a crash in the middle of a write
        fh.write('{"id": "p2-7", "messages": [{"role": "us')
    again = regenerate(tiny_target, ps, out, PARAMS, batch_size=4, progress=False)
    assert again.done_before == 5 and again.written == 7
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(p.id for p in ps)  # every prompt exactly once
    assert regenerate(tiny_target, ps, out, PARAMS, progress=False).written == 0


def test_deadline_stops_between_batches_and_too_long_prompts_are_counted(tiny_target, tmp_path):
    ps = prompts(6, seed=3)
    out = tmp_path / "r.jsonl"
    stats = regenerate(tiny_target, ps, out, PARAMS, batch_size=2, deadline=time.time() - 1, progress=False)
    assert stats.stopped_early and stats.written == 0
    stats = regenerate(tiny_target, ps, out, PARAMS, batch_size=2, max_prompt_tokens=20, progress=False)
    assert stats.too_long > 0 and stats.written == 6 - stats.too_long
