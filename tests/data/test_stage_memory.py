"""Memory between the regeneration stages: each stage's generator and scratch are released before the next
stage sizes its rows, and a stage of written turns prefills its rows in parts (on an H200 the follow-up stage
prefilled 512, then 2,048 rows in one forward and asked 21.96, then 87.83 GiB for the attention scores)."""

from __future__ import annotations

import gc
import weakref

from eaglet.data import refill, self_prompts, sources
from eaglet.data.self_prompts import TurnConfig, self_prompt_jobs, write_turns
from eaglet.data.sources import answer_sources
from eaglet.generate import PlainGenerator, StopChecker
from eaglet.sampling import SamplingParams
from eaglet.session import Session
from eaglet.train_options import RegenConfig
from tests.train.helpers import prompts


def _admissions(monkeypatch) -> list[list[list[int]]]:
    seen = []
    admit = Session.admit
    monkeypatch.setattr(Session, "admit", lambda self, rows, ps, *a, **k: seen.append(ps) or admit(self, rows, ps,
                                                                                                     *a, **k))
    return seen


def test_a_batch_is_prefilled_in_parts_of_bounded_tokens_with_the_same_answers(tiny_target, monkeypatch):
    ps = [[5 + i] * (3 + 2 * i) for i in range(6)]  # 3..13 tokens
    params = SamplingParams(max_new_tokens=6)
    whole = PlainGenerator(tiny_target, 64).generate(ps, params)
    seen = _admissions(monkeypatch)
    parts = PlainGenerator(tiny_target, 64).generate(ps, params, prefill_tokens=20)
    assert [c.tokens for c in parts] == [c.tokens for c in whole]
    assert len(seen) > 1 and sum(map(len, seen)) == len(ps)
    assert all(len(p) == 1 or len(p) * max(map(len, p)) <= 20 for p in seen)


def test_turns_are_written_with_admissions_of_at_most_prefill_tokens(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setattr(self_prompts, "PREFILL_TOKENS", 8)
    seen = _admissions(monkeypatch)
    write_turns(tiny_target, self_prompt_jobs(8), tmp_path / "t.jsonl", TurnConfig(batch_size=8, max_new_tokens=3),
                "self-prompts", progress=False)
    assert sum(map(len, seen)) == 8 and max(map(len, seen)) < 8  # 8 prompts of 2 tokens: 16 padded
    assert all(len(p) == 1 or len(p) * max(map(len, p)) <= 8 for p in seen)


def test_a_stage_of_turns_leaves_no_cache_behind(tiny_target, tmp_path, monkeypatch):
    """On a GPU the generator's decode chunk and its closure hold each other and the cache: with the cyclic
    collector not yet run, the stage's cache outlived it into the next stage, which sized its rows beside it."""
    caches = []

    def chunked(target, longest, max_new_tokens):  # chunks, as under CUDA graphs
        gen = PlainGenerator(target, refill.capacity(target, longest, max_new_tokens), compile=False, chunk=2)
        new = gen._cache
        gen._cache = lambda batch: caches.append(weakref.ref(c := new(batch))) or c
        return gen

    monkeypatch.setattr(self_prompts, "generator_for", chunked)
    gc.collect()
    gc.disable()
    try:
        write_turns(tiny_target, self_prompt_jobs(4), tmp_path / "t.jsonl",
                    TurnConfig(temperature=0.0, batch_size=4, max_new_tokens=3), "self-prompts", progress=False)
        assert caches and all(ref() is None for ref in caches)
    finally:
        gc.enable()


def test_the_follow_up_stage_starts_without_the_refills_admission_scratch(tiny_target, tmp_path, monkeypatch):
    """The Refill's session (its cache read by its captured steps) serves every stage; its admission scratch
    caches (one per power-of-two count of rows) are freed before the follow-up stage sizes its rows."""
    check = StopChecker.check  # answers end after 1 to 4 tokens: rows free up apart, admissions land scattered
    monkeypatch.setattr(StopChecker, "check", lambda self, tokens, n_new=1: check(self, tokens, n_new) or (
        len(tokens) if len(tokens) > tokens[0] % 4 else None))
    scratch, at_follow_ups = [], []
    answer = refill.Refill.answer

    def answering(self, *args):
        answer(self, *args)
        scratch.extend(weakref.ref(c) for s in self.sessions.values() for c in s.landing.scratch.values())

    write = sources.write_turns

    def writing(target, jobs, path, cfg, kind, *args, **kwargs):
        if kind == "follow-ups":
            at_follow_ups.append([ref() is None for ref in scratch])
        return write(target, jobs, path, cfg, kind, *args, **kwargs)

    monkeypatch.setattr(refill.Refill, "answer", answering)
    monkeypatch.setattr(sources, "write_turns", writing)
    ps = [p.__class__(p.id, p.messages, "train", "chat") for p in prompts(12, seed=31)]
    answer_sources(tiny_target, ps, tmp_path / "r.jsonl", RegenConfig(batch_size=4, max_new_tokens=6, follow_ups=1.0),
                   progress=False)
    assert scratch and at_follow_ups == [[True] * len(scratch)]
