"""The OpenAI API through the `openai` client: answers equal offline greedy decoding, streaming
and not, chat and text completions, usage, models, health, and metrics that add up."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from eaglet.chat import encode_chat
from eaglet.generate import PlainGenerator
from eaglet.sampling import SamplingParams
from tests.serve.conftest import CONTEXT

QUESTIONS = ["the cat sat", "a red fox jumps over the lazy dog", "hi", "blue or red?", "to the mat and then",
             "if the dog ran", "big", "over and over"]


def offline(engine, prompts: list[list[int]], n: int) -> list[str]:
    """Greedy answers of plain decoding, one prompt at a time: the oracle for every server answer."""
    gen = PlainGenerator(engine.target, CONTEXT)
    tok = engine.target.tokenizer
    return [tok.decode(gen.generate([p], SamplingParams(max_new_tokens=n))[0].tokens, skip_special_tokens=True)
            for p in prompts]


def chat_prompt(engine, q: str) -> list[int]:
    return encode_chat(engine.target.tokenizer, [{"role": "user", "content": q}])


def test_concurrent_greedy_chat_equals_offline_and_metrics_add_up(served):
    client = served.client()
    before = {k: served.metric(k) for k in ("eaglet_generation_tokens_total", "eaglet_prompt_tokens_total",
                                            'eaglet_requests_total{outcome="finished"}',
                                            "eaglet_inter_token_latency_seconds_count")}

    def ask(q):
        return client.chat.completions.create(model=served.model, messages=[{"role": "user", "content": q}],
                                              max_tokens=40, temperature=0)

    with ThreadPoolExecutor(8) as pool:  # more requests than rows (4): they queue, join and leave
        answers = list(pool.map(ask, QUESTIONS))
    want = offline(served.engine, [chat_prompt(served.engine, q) for q in QUESTIONS], 40)
    assert [a.choices[0].message.content for a in answers] == want
    assert all(a.object == "chat.completion" and a.choices[0].message.role == "assistant" for a in answers)
    completion = sum(a.usage.completion_tokens for a in answers)
    prompt = sum(a.usage.prompt_tokens for a in answers)
    assert [a.usage.prompt_tokens for a in answers] == [len(chat_prompt(served.engine, q)) for q in QUESTIONS]
    assert served.metric("eaglet_generation_tokens_total") - before["eaglet_generation_tokens_total"] == completion
    assert served.metric("eaglet_prompt_tokens_total") - before["eaglet_prompt_tokens_total"] == prompt
    assert served.metric('eaglet_requests_total{outcome="finished"}') \
        - before['eaglet_requests_total{outcome="finished"}'] == len(QUESTIONS)
    assert served.metric("eaglet_time_to_first_token_seconds_count") >= len(QUESTIONS)
    # one inter-token sample per token after each answer's first
    assert served.metric("eaglet_inter_token_latency_seconds_count") \
        - before["eaglet_inter_token_latency_seconds_count"] == completion - len(QUESTIONS)
    assert served.metric("eaglet_verifies_total") > 0 and served.metric("eaglet_accepted_tokens_total") > 0
    assert served.metric("eaglet_running_rows") == 0 and served.metric("eaglet_queue_depth") == 0


def test_streaming_chat_with_usage(served):
    client = served.client()
    q = QUESTIONS[1]
    plain = client.chat.completions.create(model=served.model, messages=[{"role": "user", "content": q}],
                                           max_tokens=30, temperature=0)
    chunks = list(client.chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": q}], max_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens


def _http_chunks(url: str, path: str, body: dict) -> list[bytes]:
    """POST ``body`` over a raw socket -> the response's HTTP chunks (chunked transfer encoding), one per write
    of the server, the empty terminating chunk left out."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: "
                     f"{len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        raw = b""
        while part := conn.recv(65536):
            raw += part
    head, rest = raw.split(b"\r\n\r\n", 1)
    assert b"chunked" in head.lower(), head
    chunks = []
    while True:
        size, rest = rest.split(b"\r\n", 1)
        if int(size, 16) == 0:
            return chunks
        chunks.append(rest[: int(size, 16)])
        rest = rest[int(size, 16) + 2:]


def test_stream_writes_role_with_first_text_and_the_end_at_once(served):
    """The role chunk goes out with the first text; the finish chunk, the usage chunk and [DONE] go out as one
    write (at concurrency 1 the client's next request waits for the end: each write is a wake-up of the client
    and a trip through the server's loop)."""
    chunks = _http_chunks(served.url, "/v1/chat/completions", {
        "model": served.model, "messages": [{"role": "user", "content": QUESTIONS[0]}], "max_tokens": 12,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    first = [json.loads(e.removeprefix("data: "))["choices"][0]["delta"] for e in chunks[0].decode().split("\n\n")[:-1]]
    assert first[0] == {"role": "assistant", "content": ""} and len(first) >= 2 and first[1]["content"]
    last = chunks[-1].decode()
    events = [json.loads(e.removeprefix("data: ")) for e in last.split("\n\n")[:-2]]
    assert last.endswith("data: [DONE]\n\n") and not any(b"[DONE]" in c for c in chunks[:-1])
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 12 and events[-1]["choices"] == []


def test_stream_interval_gathers_tokens_into_fewer_chunks(served):
    """--stream-interval 4: after the first token, the tokens go out 4 or more at a time (the last chunk
    whatever is left), so 30 tokens make at most 1 + ceil(29 / 4) chunks; the text is the same."""
    client = served.client()
    q = QUESTIONS[4]
    messages = [{"role": "user", "content": q}]
    want = client.chat.completions.create(model=served.model, messages=messages, max_tokens=30, temperature=0)

    def deltas() -> list[str]:
        chunks = client.chat.completions.create(model=served.model, messages=messages, max_tokens=30,
                                                temperature=0, stream=True)
        return [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]

    every = deltas()
    served.scheduler.stream_interval = 4
    try:
        gathered = deltas()
    finally:
        served.scheduler.stream_interval = 1
    assert "".join(every) == "".join(gathered) == want.choices[0].message.content
    # The random draft is mostly rejected (a token or two a step), so ungathered the 30 tokens take far more
    # than 9 chunks; how many exactly depends on how far the HTTP thread lags the engine (a loaded CI machine
    # merged them into 4), so only the gathered bound is asserted.
    assert len(gathered) <= 1 + 8


def test_text_completions_streaming_and_not(served):
    client = served.client()
    tok = served.engine.target.tokenizer
    text = "the big dog ran to the"
    [want] = offline(served.engine, [tok(text, add_special_tokens=False)["input_ids"]], 20)
    got = client.completions.create(model=served.model, prompt=text, max_tokens=20, temperature=0)
    assert got.choices[0].text == want and got.usage.completion_tokens == 20 and got.object == "text_completion"
    streamed = list(client.completions.create(model=served.model, prompt=text, max_tokens=20, temperature=0,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed) == want
    ids = client.completions.create(model=served.model, prompt=[5, 6, 7], max_tokens=3, temperature=0)
    assert ids.usage.prompt_tokens == 3


def test_stop_and_sampling_settings(served):
    client = served.client()
    msgs = [{"role": "user", "content": QUESTIONS[0]}]
    full = client.chat.completions.create(model=served.model, messages=msgs, max_tokens=30, temperature=0)
    text = full.choices[0].message.content
    stop = next(c for c in text[5:] if c.isascii() and c.isalnum())  # random bytes decode to odd characters
    cut = client.chat.completions.create(model=served.model, messages=msgs, max_tokens=30, temperature=0, stop=stop)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]  # left out, as OpenAI does
    streamed = client.chat.completions.create(model=served.model, messages=msgs, max_tokens=30, temperature=0,
                                              stop=[stop, "never"], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == text[: text.index(stop)]
    seeded = [client.chat.completions.create(model=served.model, messages=msgs, max_tokens=12, temperature=0.9,
                                             top_p=0.95, seed=7, extra_body={"top_k": 20}) for _ in range(2)]
    assert seeded[0].choices[0].message.content == seeded[1].choices[0].message.content
    assert seeded[0].usage.completion_tokens == 12


def test_models_health_metrics(served):
    models = served.client().models.list()
    assert [m.id for m in models.data] == [served.model]
    assert httpx.get(f"{served.url}/health").json() == {"status": "ok"}
    text = httpx.get(f"{served.url}/metrics").text
    for name in ("eaglet_requests_total", "eaglet_queue_depth", "eaglet_running_rows", "eaglet_prompt_tokens_total",
                 "eaglet_generation_tokens_total", "eaglet_time_to_first_token_seconds_bucket",
                 "eaglet_inter_token_latency_seconds_bucket", "eaglet_verifies_total", "eaglet_accepted_tokens_total",
                 "eaglet_engine_steps_total"):
        assert name in text


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4"}, "model"),
    ({"messages": [{"role": "user", "content": "hi " * 200}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": CONTEXT}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "temperature"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ({"messages": []}, "messages"),
])
def test_bad_requests_get_400_in_openai_envelope(served, body, param):
    import openai

    body = {"model": served.model, **body}
    with pytest.raises(openai.BadRequestError) as e:
        served.client().chat.completions.create(**body)
    err = e.value.body
    assert e.value.status_code == 400 and set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_malformed_body_and_bad_prompt_ids(served):
    r = httpx.post(f"{served.url}/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{served.url}/v1/chat/completions", json={"model": served.model})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(f"{served.url}/v1/completions", json={"model": served.model, "prompt": [10**6]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    # the server goes on
    ok = served.client().completions.create(model=served.model, prompt="a", max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens == 2


def test_tokens_queued_behind_one_another_go_out_as_one_chunk():
    import asyncio

    from eaglet.generate import Completion
    from eaglet.serve.app import coalesced
    from eaglet.serve.scheduler import Failure

    async def run():
        q = asyncio.Queue()
        for e in ([3, 4], [5], Completion([1, 2, 3, 4, 5], "stop"), [9]):
            q.put_nowait(e)
        first = coalesced([1, 2], q)  # the tokens, merged, then the end; nothing past the end is read
        assert first == [[1, 2, 3, 4, 5], Completion([1, 2, 3, 4, 5], "stop")] and q.qsize() == 1
        q.get_nowait()
        assert coalesced([7], q) == [[7]]  # nothing waiting
        q.put_nowait(Failure(500, "boom"))
        assert coalesced(Failure(503, "stop"), q) == [Failure(503, "stop")] and q.qsize() == 1

    asyncio.run(run())


def test_a_stream_sends_its_headers_with_its_first_text():
    """Not as the handler returns: the HTTP thread's work for them would run while the engine prefills."""
    import asyncio

    from eaglet.serve.app import EventStream, _End

    async def run(texts: list[str]) -> list:
        sent, gate = [], asyncio.Event()

        async def body():
            await gate.wait()
            for t in texts:
                yield t

        async def send(message):
            sent.append((message["type"], message.get("body", b"").decode(), message.get("more_body")))

        task = asyncio.create_task(EventStream(body(), media_type="text/event-stream").stream_response(send))
        await asyncio.sleep(0.01)
        assert sent == []  # the first event has not come: nothing, headers included
        gate.set()
        await task
        return sent

    start = ("http.response.start", "", None)
    assert asyncio.run(run(["data: a\n\n", _End("data: [DONE]\n\n")])) == [
        start, ("http.response.body", "data: a\n\n", True), ("http.response.body", "data: [DONE]\n\n", False)]
    assert asyncio.run(run([])) == [start, ("http.response.body", "", False)]  # a body that ends with no text


def test_overlapped_hand_off_delivers_the_same_answers(served_dirs, one_thread):
    """``overlap`` (``--overlap-handoff``): a step's tokens reach the loop only once the next step is queued, or
    before the worker waits; every request still gets all its tokens, in order, and its end."""
    from tests.serve.conftest import Served, new_engine

    served = Served(new_engine(served_dirs), overlap=True)
    try:
        client = served.client(timeout=60)  # a token left unposted would hang the request, not fail it
        messages = [[{"role": "user", "content": q}] for q in QUESTIONS]

        def ask(m):
            return client.chat.completions.create(model=served.model, messages=m, max_tokens=40, temperature=0)

        def streamed(m):
            chunks = client.chat.completions.create(model=served.model, messages=m, max_tokens=40, temperature=0,
                                                    stream=True)
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        with ThreadPoolExecutor(8) as pool:  # more requests than rows: they queue, join and leave
            answers = [a.choices[0].message.content for a in pool.map(ask, messages)]
            streams = list(pool.map(streamed, messages))
        want = offline(served.engine, [chat_prompt(served.engine, q) for q in QUESTIONS], 40)
        assert answers == streams == want
        assert served.metric('eaglet_requests_total{outcome="finished"}') == 2 * len(QUESTIONS)
    finally:
        served.stop()
