"""`eaglet serve --tp 2` on gloo: the same greedy answers as tp=1, and SIGTERM or Ctrl-C (SIGINT to the
launching process) stops every rank with status 0."""

from __future__ import annotations

import signal

import httpx
import openai
import pytest

from tests.serve.conftest import Served, new_engine, start_server
from tests.serve.test_faults import background

PROMPTS = ["the cat sat on the mat", "a dog ran", "hello there, how", "one two three four"]


def _answers(client: openai.OpenAI, model: str) -> list[str]:
    """All prompts at once (they share a batch), greedy."""
    jobs = [background(lambda p=p: client.completions.create(model=model, prompt=p, max_tokens=24, temperature=0))
            for p in PROMPTS]
    out = []
    for thread, box in jobs:
        thread.join(120)
        assert "result" in box, box.get("error")
        out.append(box["result"].choices[0].text)
    return out


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_tp2_server_answers_as_tp1_and_stops_on_a_signal(served_dirs, one_thread, stop):
    reference = Served(new_engine(served_dirs))
    try:
        want = _answers(reference.client(), reference.model)
    finally:
        reference.stop()

    proc, url = start_server(served_dirs, "--tp", "2", "--max-batch", "4", "--grace", "30", timeout=180)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        model = client.models.list().data[0].id
        assert _answers(client, model) == want
        assert _answers(client, model) == want  # a second batch on the same ranks
        verifies = next(float(x.split()[-1]) for x in httpx.get(f"{url}/metrics").text.splitlines()
                        if x.startswith("eaglet_verifies_total "))
        assert verifies > 0, "the tp server should decode speculatively"
        proc.send_signal(stop)
        assert proc.wait(60) == 0, proc.communicate()[1]
        err = proc.stderr.read()
        assert "server stopped" in err and "at tp=2" in err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
