"""Faults, made deterministic by a gate in front of each engine step: a full queue (429), an
exception in one request (500) or in a step, a client that leaves mid-stream, and a close
that rejects the waiting requests and aborts the running ones (503). The server goes on."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from eaglet.session import grown
from tests.serve.conftest import Served, new_engine, wait_for

FAULT = 13  # a prompt starting with this token id fails while it is admitted


class Gated:
    """The engine, with each step waiting on ``gate`` (and ``delay``), and injectable faults."""

    def __init__(self, engine):
        self.engine, self.gate, self.delay, self.fail_step = engine, threading.Event(), 0.0, False
        self.gate.set()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def session(self, batch, params):
        s = self.engine.session(batch, params)
        step, admit = s.step, s.admit

        def gated_step(launched=None):
            self.gate.wait()
            time.sleep(self.delay)
            if self.fail_step:
                raise RuntimeError("injected step fault")
            return step(launched)

        def faulty_admit(row, prompts, p):
            if any(p[0] == FAULT for p in prompts):
                raise RuntimeError("injected admission fault")
            return admit(row, prompts, p)

        s.step, s.admit = gated_step, faulty_admit
        return s

    def grow(self, small, batch):
        return grown(self, small, batch)  # the larger session gated too


@pytest.fixture
def gated(served_dirs, one_thread):
    s = Served(Gated(new_engine(served_dirs)), max_batch=1, max_queue=1)
    yield s
    s.engine.gate.set()
    s.stop()


def background(fn):
    box = {}

    def run():
        try:
            box["result"] = fn()
        except Exception as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, box


def ask(served, max_tokens=8, prompt="the cat"):
    return served.client().completions.create(model=served.model, prompt=prompt, max_tokens=max_tokens,
                                              temperature=0)


def one_running_one_waiting(gated):
    """With the gate closed: one request in the only row, one in the only queue slot."""
    gated.engine.gate.clear()
    running = background(lambda: ask(gated))
    wait_for(lambda: gated.metric("eaglet_running_rows") == 1)
    waiting = background(lambda: ask(gated))
    wait_for(lambda: gated.metric("eaglet_queue_depth") == 1)
    return running, waiting


def test_full_queue_answers_429_then_serves(gated):
    (first, box1), (second, box2) = one_running_one_waiting(gated)
    with pytest.raises(openai.RateLimitError) as e:
        ask(gated)
    assert e.value.status_code == 429 and "queue is full" in e.value.body["message"]
    assert e.value.body["type"] == "rate_limit_exceeded"
    gated.engine.gate.set()
    first.join(20)
    second.join(20)
    assert box1["result"].usage.completion_tokens == 8 and box2["result"].usage.completion_tokens == 8
    assert gated.metric('eaglet_requests_total{outcome="queue_full"}') == 1


def test_exception_in_one_request_is_500_and_the_server_goes_on(gated):
    with pytest.raises(openai.InternalServerError) as e:
        gated.client().completions.create(model=gated.model, prompt=[FAULT, 5, 6], max_tokens=4)
    assert e.value.status_code == 500 and "injected admission fault" in e.value.body["message"]
    assert ask(gated).usage.completion_tokens == 8
    gated.engine.fail_step = True
    with pytest.raises(openai.InternalServerError, match="injected step fault"):
        ask(gated)
    gated.engine.fail_step = False
    assert ask(gated).usage.completion_tokens == 8
    assert gated.metric('eaglet_requests_total{outcome="error"}') == 2
    assert gated.metric("eaglet_running_rows") == 0


def test_client_disconnect_aborts_the_row(gated):
    gated.engine.delay = 0.02
    stream = gated.client().chat.completions.create(
        model=gated.model, messages=[{"role": "user", "content": "hi"}], max_tokens=200, temperature=0, stream=True)
    next(stream)
    next(stream)
    stream.close()
    wait_for(lambda: gated.metric('eaglet_requests_total{outcome="aborted"}') == 1)
    assert gated.metric("eaglet_running_rows") == 0
    gated.engine.delay = 0.0
    assert ask(gated).usage.completion_tokens == 8  # the row was freed for the next request


def test_non_streamed_client_that_leaves_frees_its_row(gated):
    gated.engine.delay = 0.02
    with pytest.raises(httpx.TimeoutException):  # the client gives up and closes the connection
        httpx.post(f"{gated.url}/v1/completions", json={"model": gated.model, "prompt": "the", "max_tokens": 200},
                   timeout=0.5)
    wait_for(lambda: gated.metric('eaglet_requests_total{outcome="aborted"}') == 1)
    assert gated.metric("eaglet_running_rows") == 0


def test_close_rejects_waiting_and_aborts_running_rows(gated):
    (running, box1), (waiting, box2) = one_running_one_waiting(gated)
    gated.scheduler.close(0.0)
    assert httpx.get(f"{gated.url}/health").status_code == 503
    gated.engine.gate.set()
    running.join(20)
    waiting.join(20)
    for box in (box1, box2):
        assert isinstance(box["error"], openai.APIStatusError) and box["error"].status_code == 503
    with pytest.raises(openai.APIStatusError, match="shutting down"):
        ask(gated)
    gated.scheduler.join(10)
    assert not gated.scheduler.thread.is_alive()
    assert gated.metric('eaglet_requests_total{outcome="shutdown"}') == 3


def one_running_two_waiting(s) -> None:
    """A lone request opens a batch of 1 while two more queue behind it; then all three run to their end
    (the full batch grows in place to hold the two waiting)."""
    (first, _), (second, _) = one_running_one_waiting(s)
    assert s.metric("eaglet_batch_rows") == 1
    third = background(lambda: ask(s))[0]
    wait_for(lambda: s.metric("eaglet_queue_depth") == 2)
    s.engine.gate.set()
    for t in (first, second, third):
        t.join(20)


def test_batch_size_follows_the_queue(served_dirs, one_thread):
    s = Served(Gated(new_engine(served_dirs)), max_batch=4, max_queue=8)
    try:
        one_running_two_waiting(s)
        assert s.metric("eaglet_batch_rows") == 4  # 1 running + 2 waiting: the batch of 1 grew to one of 4
        assert ask(s).usage.completion_tokens == 8 and s.metric("eaglet_batch_rows") == 1
    finally:
        s.engine.gate.set()
        s.stop()


def test_a_full_batch_grows_in_place_for_the_waiting(served_dirs, one_thread):
    """The two waiting join the running request at once, in a batch of 4, rather than after it ends;
    all three (the same prompt, greedy) answer the same."""
    s = Served(Gated(new_engine(served_dirs)), max_batch=4, max_queue=8)
    try:
        s.engine.delay = 0.05
        s.engine.gate.clear()
        jobs = [background(lambda: ask(s))]
        wait_for(lambda: s.metric("eaglet_running_rows") == 1)
        jobs += [background(lambda: ask(s)) for _ in range(2)]
        wait_for(lambda: s.metric("eaglet_queue_depth") == 2)
        s.engine.gate.set()
        wait_for(lambda: s.metric("eaglet_running_rows") == 3)  # the first (8 tokens) still runs
        assert s.metric("eaglet_batch_rows") == 4
        for t, _ in jobs:
            t.join(20)
        texts = {box["result"].choices[0].text for _, box in jobs}
        assert len(texts) == 1 and all(box["result"].usage.completion_tokens == 8 for _, box in jobs)
    finally:
        s.engine.gate.set()
        s.stop()


def test_batch_opens_with_the_smallest_allowed_size(served_dirs, one_thread):
    s = Served(Gated(new_engine(served_dirs)), max_queue=8, sizes=(1, 4))
    try:
        one_running_two_waiting(s)
        assert s.metric("eaglet_batch_rows") == 4  # 1 running + 2 waiting: 3 rows are not allowed, 4 are
    finally:
        s.engine.gate.set()
        s.stop()
