"""`eaglet serve` as a process: SIGTERM during requests lets them finish within the grace
period, refuses new work, and exits 0."""

from __future__ import annotations

import signal

import httpx
import openai

from tests.serve.conftest import start_server, wait_for
from tests.serve.test_faults import background


def test_sigterm_finishes_running_requests_and_exits_0(served_dirs):
    proc, url = start_server(served_dirs, "--max-batch", "2", "--grace", "60")
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        model = client.models.list().data[0].id

        def long_stream():
            chunks = client.completions.create(model=model, prompt="the cat sat on the mat", max_tokens=200,
                                               temperature=0, stream=True, stream_options={"include_usage": True})
            return list(chunks)

        def running_rows() -> float:
            lines = httpx.get(f"{url}/metrics").text.splitlines()
            return float(next(x for x in lines if x.startswith("eaglet_running_rows ")).split()[-1])

        # Usually the first request runs alone (a batch of 1) and, once it drains, the other two
        # share a batch of 2; all three share one when they reach the queue together.
        jobs = [background(long_stream) for _ in range(3)]
        wait_for(lambda: running_rows() >= 2, 60)
        proc.send_signal(signal.SIGTERM)
        for thread, _ in jobs:
            thread.join(60)
        assert proc.wait(60) == 0
        finished = [box for _, box in jobs if "result" in box]
        assert len(finished) >= 2, [box.get("error") for _, box in jobs]  # the running ones finish
        for box in finished:
            assert box["result"][-1].usage.completion_tokens == 200
        for _, box in jobs:  # a request still waiting at SIGTERM is refused (in the stream), not lost silently
            assert "result" in box or "shutting down" in str(box["error"])
        assert "server stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    try:  # nothing listens on the port any more
        httpx.get(f"{url}/health", timeout=2)
        raise AssertionError("the server still answers")
    except httpx.TransportError:
        pass
