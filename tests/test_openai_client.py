"""The shared OpenAI-compatible client: transient failures are retried, lasting ones end in one sentence."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import eaglet.openai_client as client
from eaglet.errors import EagletError


def _post(answers: list, monkeypatch) -> tuple[object, list]:
    """POST through a mock server that gives ``answers`` in turn (a status, or an exception to raise)."""
    monkeypatch.setattr(client, "BACKOFF_S", 0.0)
    seen = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        a = answers[min(len(seen), len(answers)) - 1]
        if isinstance(a, Exception):
            raise a
        body = {"ok": True} if a == 200 else {"error": {"message": f"nope {a}"}}
        return httpx.Response(a, json=body)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as c:
            return await client.post_json(c, "http://srv/v1/chat/completions", {"x": 1})

    try:
        return asyncio.run(go()), seen
    except EagletError as e:
        return e, seen


def test_transient_failures_are_retried(monkeypatch):
    refused = httpx.ConnectError("refused")
    got, seen = _post([refused, 503, 429, 200], monkeypatch)
    assert got == {"ok": True} and len(seen) == 4


def test_a_lasting_refusal_is_not_retried_and_names_the_status_and_message(monkeypatch):
    got, seen = _post([400], monkeypatch)
    assert isinstance(got, EagletError) and len(seen) == 1
    assert str(got) == "http://srv/v1/chat/completions refused the request with HTTP 400: nope 400"


def test_retries_end_in_one_sentence(monkeypatch):
    got, seen = _post([502], monkeypatch)
    assert isinstance(got, EagletError) and len(seen) == client.RETRIES + 1
    assert "failed 7 times in a row, the last time with HTTP 502: nope 502" in str(got)


@pytest.mark.parametrize("url,base", [("http://h:1", "http://h:1/v1"), ("http://h:1/v1/", "http://h:1/v1")])
def test_api_base(url, base):
    assert client.api_base(url) == base
