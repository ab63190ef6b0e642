"""Requests waiting when rows free up join the running batch in one prefill: their answers are
plain greedy decoding's, the metrics count each one, and a request whose admission raises fails
alone (the others of its group are admitted one by one)."""

from __future__ import annotations

import openai
import pytest

import eaglet.session
import eaglet.speculative.session
from tests.serve.conftest import Served, new_engine, wait_for
from tests.serve.test_api import offline
from tests.serve.test_faults import FAULT, Gated, background

PROMPTS = [[5, 9, 14, 3], [7, 7, 2, 30, 11, 4, 8], [21, 6], [40, 41, 42, 43, 44]]


@pytest.fixture
def counted(served_dirs, one_thread, monkeypatch):
    """A server of up to 4 rows behind a gate, and the prompts of each target prefill (plain or with capture)."""
    prefills = []
    for module in (eaglet.session, eaglet.speculative.session):
        original = module.prefill
        monkeypatch.setattr(module, "prefill", lambda *a, _f=original: prefills.append(a[2]) or _f(*a))
    s = Served(Gated(new_engine(served_dirs)), max_batch=4, max_queue=8)
    yield s, prefills
    s.engine.gate.set()
    s.stop()


def ask(served, prompt: list[int], max_tokens: int = 12):
    return served.client().completions.create(model=served.model, prompt=prompt, max_tokens=max_tokens,
                                              temperature=0)


def first_running_then_waiting(served, prompts: list[list[int]]) -> list:
    """With the gate closed: PROMPTS[0] alone in a batch of 1, then ``prompts`` waiting behind it."""
    served.engine.gate.clear()
    asked = [background(lambda: ask(served, PROMPTS[0]))]
    wait_for(lambda: served.metric("eaglet_running_rows") == 1)
    for n, p in enumerate(prompts, 1):  # queued in this order
        asked.append(background(lambda p=p: ask(served, p)))
        wait_for(lambda n=n: served.metric("eaglet_queue_depth") == n)
    served.engine.gate.set()
    for t, _ in asked:
        t.join(30)
    return [box.get("result", box.get("error")) for _, box in asked]


def test_waiting_requests_join_in_one_prefill_and_answer_as_plain_decoding(counted):
    served, prefills = counted
    answers = first_running_then_waiting(served, PROMPTS[1:])
    assert prefills == [PROMPTS[:1], PROMPTS[1:]]  # the three waiting: one prefill of a batch of 4
    assert [a.choices[0].text for a in answers] == offline(served.engine, PROMPTS, 12)
    assert all(a.usage.completion_tokens == 12 for a in answers)
    assert served.metric("eaglet_prompt_tokens_total") == sum(map(len, PROMPTS))
    assert served.metric("eaglet_time_to_first_token_seconds_count") == len(PROMPTS)
    assert served.metric('eaglet_requests_total{outcome="finished"}') == len(PROMPTS)


def test_a_failing_admission_fails_only_the_request_at_fault(counted):
    served, prefills = counted
    bad = [FAULT, 5, 6]
    answers = first_running_then_waiting(served, [PROMPTS[1], bad, PROMPTS[3]])
    assert isinstance(answers[2], openai.InternalServerError) and "injected admission fault" in str(answers[2])
    assert prefills == [PROMPTS[:1], [PROMPTS[1]], [PROMPTS[3]]]  # the group's call raised before its prefill
    ok = [PROMPTS[0], PROMPTS[1], PROMPTS[3]]
    assert [answers[i].choices[0].text for i in (0, 1, 3)] == offline(served.engine, ok, 12)
    assert served.metric('eaglet_requests_total{outcome="error"}') == 1
    assert served.metric("eaglet_prompt_tokens_total") == sum(map(len, ok))
