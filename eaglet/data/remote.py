"""Regeneration through a running OpenAI-compatible server (``data regenerate --endpoint URL``).

For a target too large for one machine: the user's own SGLang, vLLM or ``eaglet serve``
deployment answers the prompts. Each answer is one chat completion (``/v1/chat/completions``,
not streamed) with the run's settings: ``max_tokens``, ``temperature`` (the answer's), ``top_p``,
``top_k`` when set, and for a sampled answer its own ``seed`` (the run's seed and the answer's
id, as in local regeneration; how far a server honours it is the server's). At most
``concurrency`` requests are in flight; a transient failure is retried (``eaglet.openai_client``).

The local ``--target`` supplies only the tokenizer (no weights are read): prompts are counted
with it for ``--max-prompt-tokens``, as in local regeneration, so both skip the same prompts.
Records hold the answer's text and the server's token counts but no ``answer_ids`` (the
server's token ids are not part of the chat API): training tokenizes the text, as for any
dataset answer, and ``target_turns`` says the target wrote the answer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from eaglet.data.prompts import note
from eaglet.data.refill import Answer, Job
from eaglet.errors import EagletError
from eaglet.openai_client import post_json
from eaglet.sampling import SamplingParams
from eaglet.train_options import REGEN_CONCURRENCY

POLL_S = 0.5  # how often the loop looks at Ctrl-C while every request in flight is still running
TIMEOUT_S = 900.0  # one answer of a large model at a busy server can take minutes


@dataclass(frozen=True)
class Endpoint:
    """A server that answers in the target's place: its API base, the model name, the model's tokenizer."""

    base: str  # e.g. http://host:8000/v1 (``openai_client.api_base``)
    model: str
    tokenizer: object
    concurrency: int = REGEN_CONCURRENCY

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")


def answer_remotely(ep: Endpoint, jobs: list[Job], params: SamplingParams, admitting: Callable[[], bool],
                    done: Callable[[list[Answer]], None]) -> None:
    """Answer ``jobs`` through ``ep``, the contract of ``Refill.answer``: ``admitting()`` before each
    request, ``done(answers)`` with those finished since the last call (at least every POLL_S); an
    exception from ``done`` or a failed request cancels the requests in flight."""
    asyncio.run(_ask_all(ep, jobs, params, admitting, done))


async def _ask_all(ep: Endpoint, jobs: list[Job], params: SamplingParams, admitting: Callable[[], bool],
                   done: Callable[[list[Answer]], None]) -> None:
    queue, running, counted = deque(jobs), set(), []
    limits = httpx.Limits(max_connections=ep.concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S, connect=10.0), limits=limits) as client:
        try:
            while True:
                while queue and len(running) < ep.concurrency:
                    if not admitting():
                        queue.clear()  # the budget ended: the answers in flight finish, no request follows
                        break
                    running.add(asyncio.create_task(_ask(client, ep, queue.popleft(), params, counted)))
                if not running:
                    return
                finished, running = await asyncio.wait(running, timeout=POLL_S,
                                                       return_when=asyncio.FIRST_COMPLETED)
                failed = [t.exception() for t in finished if t.exception() is not None]
                done([t.result() for t in finished if t.exception() is None])  # kept before a failure ends the run
                if failed:
                    raise failed[0]
        finally:
            for t in running:
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)


async def _ask(client: httpx.AsyncClient, ep: Endpoint, job: Job, params: SamplingParams,
               counted: list[bool]) -> Answer:
    body = {"model": ep.model, "messages": list(job.conv.prompt()), "max_tokens": params.max_new_tokens,
            "temperature": job.temperature, "top_p": params.top_p,
            **({"top_k": params.top_k} if params.top_k else {}), **({"seed": job.seed} if job.temperature else {})}
    data = await post_json(client, f"{ep.base}/chat/completions", body)
    try:
        choice = data["choices"][0]
        text = choice["message"]["content"] or ""
        usage = data.get("usage") or {}
    except (KeyError, IndexError, TypeError):
        raise EagletError(f"{ep.base}/chat/completions answered without a message: {str(data)[:200]}") from None
    prompt_tokens = usage.get("prompt_tokens", len(job.prompt))
    if prompt_tokens != len(job.prompt) and not counted:
        counted.append(True)  # said once: every prompt would say it
        note(f"the server counted {prompt_tokens} prompt tokens where --target's tokenizer counts "
             f"{len(job.prompt)} (answer {job.conv.id}); --max-prompt-tokens is applied with --target's count, "
             "so pass the served model's directory as --target")
    completion = usage.get("completion_tokens")
    if completion is None:
        completion = len(ep.tokenizer(text, add_special_tokens=False)["input_ids"])
    return Answer(job, text, "length" if choice.get("finish_reason") == "length" else "stop", prompt_tokens,
                  completion, None)
