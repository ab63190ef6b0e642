"""The OpenAI-compatible HTTP API (FastAPI): chat and text completions, models, health, metrics.

Handlers tokenize, check the request against the context, submit it to the scheduler
and relay its tokens: as one JSON body, or as server-sent events (``data: {chunk}``,
ending ``data: [DONE]``). Text is detokenized incrementally (``text.StreamText``): each event
carries what the tokens so far add to the text. As in OpenAI's API, a stop string ends
the answer (``finish_reason: "stop"``) and is left out of the text, while the tokens
(``usage``) include the one that completed it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from eaglet.chat import encode_chat, encode_text
from eaglet.generate import Completion
from eaglet.serve.metrics import Metrics
from eaglet.serve.protocol import BadRequest, ChatRequest, CompletionRequest, error_body
from eaglet.serve.scheduler import Failure, QueueFull, Scheduler, ShuttingDown
from eaglet.serve.scheduler import Request as Job
from eaglet.serve.text import StreamText

_KINDS = {400: "invalid_request_error", 429: "rate_limit_exceeded", 500: "internal_error", 503: "unavailable"}


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, _KINDS.get(status, "error"), param, code), status_code=status)


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class _End(str):
    """The last text of a stream: ``EventStream`` sends it with the end of the body."""


class EventStream(StreamingResponse):
    """A streaming response whose last text (an ``_End``) and the end of the body go out in one write (with
    chunked encoding, the terminating empty chunk): the client's read of the answer ends at that write, not at
    a second one after the generator has finished. The headers go out with the first text, not as soon as the
    handler returns: then the HTTP thread's work for them would run while the engine admits and prefills the
    request, taking the GIL from its launches (a client sees no text before the first token either way)."""

    async def stream_response(self, send) -> None:
        start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        async for text in self.body_iterator:
            if start:
                await send(start)
                start = None
            last = isinstance(text, _End)
            await send({"type": "http.response.body", "body": text.encode(self.charset), "more_body": not last})
            if last:
                await self.body_iterator.aclose()
                return
        if start:
            await send(start)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def coalesced(first, queue: asyncio.Queue) -> list:
    """``first`` and the events already waiting in ``queue`` behind it, new tokens merged into one list:
    [tokens], [tokens, end] or [end] (an end is a Completion, a Failure or None, the client gone; always
    last)."""
    events = [first]
    while isinstance(events[-1], list) and not queue.empty():
        nxt = queue.get_nowait()
        if isinstance(nxt, list):
            events[-1] = events[-1] + nxt
        else:
            events.append(nxt)
    return events


def build_app(engine, scheduler: Scheduler, metrics: Metrics, model_name: str) -> FastAPI:
    target = engine.target
    app = FastAPI(title="eaglet", docs_url=None, redoc_url=None)
    created = int(time.time())

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, exc: RequestValidationError):
        metrics.requests.labels("bad_request").inc()
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return _error(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', '')}")
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        return _error(400, f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid request')}",
                      ".".join(loc) or None)

    @app.exception_handler(BadRequest)
    async def _bad(_request, exc: BadRequest):
        metrics.requests.labels("bad_request").inc()
        return _error(400, str(exc), exc.param, exc.code)

    @app.exception_handler(Exception)
    async def _internal(_request, exc: Exception):
        traceback.print_exception(exc, file=sys.stderr)
        metrics.requests.labels("error").inc()
        return _error(500, f"internal error: {exc}")

    @app.get("/health")
    async def health():
        if not scheduler.accepting:
            return _error(503, "the server is shutting down")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "eaglet", "max_model_len": engine.capacity}]}

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def prepare(body: ChatRequest | CompletionRequest, prompt: list[int], param: str) -> Job:
        if body.model != model_name:
            raise BadRequest(f"the model {body.model!r} is not served here; this server serves {model_name!r}",
                             "model", "model_not_found")
        room = engine.capacity - len(prompt)
        if room < 1:
            raise BadRequest(f"the prompt has {len(prompt)} tokens but the context holds {engine.capacity}",
                             param, "context_length_exceeded")
        limit = body.limit if body.limit is not None else room
        if limit > room:
            raise BadRequest(f"max_tokens={limit} does not fit: the prompt has {len(prompt)} tokens and the "
                             f"context holds {engine.capacity}, so at most {room}", "max_tokens",
                             "context_length_exceeded")
        return Job(prompt, body.sampling(limit), asyncio.get_running_loop())

    async def run(http: Request, body, job: Job, chat: bool):
        try:
            scheduler.submit(job)
        except QueueFull:
            metrics.requests.labels("queue_full").inc()
            return _error(429, f"the queue is full ({scheduler.max_queue} requests waiting); retry later")
        except ShuttingDown:
            metrics.requests.labels("shutdown").inc()
            return _error(503, "the server is shutting down")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if body.stream:
            return EventStream(_stream(http, body, job, chat, rid), media_type="text/event-stream")
        async for event in _events(http, job):
            if isinstance(event, Failure):
                return _error(event.status, event.message)
            if isinstance(event, Completion):
                content = StreamText(target.tokenizer, job.params.stop).add(event.tokens, final=True)
                return _response(body, job, event, content, chat, rid)
        return Response(status_code=499)  # the client left; nobody reads this

    async def _events(http: Request, job: Job) -> AsyncIterator:
        """The job's events until its end. A client that leaves (a disconnect seen by ``_watch``, or the
        streaming task cancelled) cancels the job: the scheduler frees its row between steps.

        New tokens that queued up meanwhile come as one event (one chunk of the stream): when the
        loop falls behind the engine (many rows, a step every ~2 ms), each chunk's formatting and
        write is paid once, not once per step, and this thread holds the GIL less."""
        ended, watcher = False, asyncio.create_task(_watch(http, job))
        try:
            while True:
                for out in coalesced(await job.events.get(), job.events):
                    if out is None:  # the client left
                        return
                    ended = isinstance(out, (Completion, Failure))
                    yield out
                    if ended:
                        return
        finally:
            watcher.cancel()
            job.cancelled = not ended

    async def _watch(http: Request, job: Job) -> None:
        """Every 0.25 s, whether the client is still there; if not, a None wakes ``_events``. (A task of its
        own: a timeout on every wait for tokens cost the loop a task and a timer per event.)"""
        while True:
            await asyncio.sleep(0.25)
            if await http.is_disconnected():
                job.events.put_nowait(None)
                return

    def _usage(job: Job, n: int) -> dict:
        return {"prompt_tokens": len(job.prompt), "completion_tokens": n, "total_tokens": len(job.prompt) + n}

    def _response(body, job: Job, done: Completion, content: str, chat: bool, rid: str) -> dict:
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": content},
                      "finish_reason": done.finish_reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": content, "finish_reason": done.finish_reason, "logprobs": None}
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": model_name, "choices": [choice], "usage": _usage(job, len(done.tokens))}

    async def _stream(http: Request, body, job: Job, chat: bool, rid: str) -> AsyncIterator[str]:
        obj, now = ("chat.completion.chunk" if chat else "text_completion"), int(time.time())

        def chunk(delta: str | None, finish: str | None = None, role: bool = False) -> dict:
            if chat:
                d = {"role": "assistant", "content": ""} if role else ({"content": delta} if delta else {})
                choice = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
            return {"id": rid, "object": obj, "created": now, "model": model_name, "choices": [choice]}

        # A delta's event, the one sent per step: the JSON around the text is the same every time.
        head, tail = _sse(chunk("\x00")).split('"\\u0000"')
        text = StreamText(target.tokenizer, job.params.stop)
        # The chat's role chunk goes out with the first text, not alone while the prefill runs (a write then is
        # the HTTP thread taking the GIL from the engine's admission); the end goes out in one write (at
        # concurrency 1 the client's next request waits for it).
        first = _sse(chunk(None, role=True)) if chat else ""
        end = "data: [DONE]\n\n"
        async for event in _events(http, job):
            if isinstance(event, Failure):
                end = _sse(error_body(event.message, _KINDS.get(event.status, "error"), None, event.status)) + end
                break
            if isinstance(event, Completion):
                if body.include_usage:
                    end = _sse({"id": rid, "object": obj, "created": now, "model": model_name, "choices": [],
                                "usage": _usage(job, len(event.tokens))}) + end
                end = _sse(chunk(text.add([], final=True), event.finish_reason)) + end
                break
            delta = text.add(event)
            if delta:
                yield first + head + json.dumps(delta) + tail
                first = ""
        yield _End(first + end)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, http: Request):
        prompt = encode_chat(target.tokenizer, [{"role": m.role, "content": m.text()} for m in body.messages])
        return await run(http, body, prepare(body, prompt, "messages"), chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request):
        prompt = body.prompt if isinstance(body.prompt, list) else \
            encode_text(target.tokenizer, body.prompt)
        if not prompt:
            raise BadRequest("the prompt is empty", "prompt")
        if any(not 0 <= t < target.config.vocab_size for t in prompt):
            raise BadRequest(f"prompt token ids must be in [0, {target.config.vocab_size})", "prompt")
        return await run(http, body, prepare(body, prompt, "prompt"), chat=False)

    return app
