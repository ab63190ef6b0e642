"""An OpenAI-compatible server seen from the client: its API base, the model it serves, retried requests.

``bench --endpoint`` measures such a server and ``data regenerate --endpoint`` has one answer
the prompts; both find the model here. A request fails at once on an answer that will not
change (a 4xx other than 408 and 429: the server's own message is quoted) and is retried with
exponential backoff on one that may (a connection error, a timeout, 408, 429, a 5xx).
"""

from __future__ import annotations

import asyncio

import httpx

from eaglet.errors import EagletError

RETRIES = 6  # after the first attempt; the waits add up to ~30 s (a server restarting, a full queue)
BACKOFF_S = 0.5  # the first wait; each next one doubles


def api_base(url: str) -> str:
    """The ``/v1`` base of a server URL given with or without it."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def served_model(base: str, model: str | None = None, timeout: float = 10.0) -> str:
    """``model`` once the server at ``base`` lists it, or the first model it lists; one sentence when the
    server cannot be reached or does not serve ``model``."""
    try:
        r = httpx.get(f"{base}/models", timeout=timeout)
        r.raise_for_status()
        listed = [m["id"] for m in r.json()["data"]]
    except httpx.TransportError as e:
        raise EagletError(f"cannot reach {base} ({type(e).__name__}: {e or 'no answer'}); is the server "
                          "running at that address?") from None
    except (httpx.HTTPStatusError, ValueError, KeyError, TypeError) as e:
        raise EagletError(f"{base}/models did not list the served models ({e}); is it an OpenAI-compatible "
                          "server?") from None
    if not listed:
        raise EagletError(f"{base}/models lists no model")
    if model is not None and model not in listed:
        raise EagletError(f"{base} serves {', '.join(map(repr, listed))}, not --model {model!r}")
    return model or listed[0]


def server_message(r: httpx.Response) -> str:
    """The message of an error answer: OpenAI's ``{"error": {"message"}}``, FastAPI's ``detail``, or the text."""
    try:
        body = r.json()
        msg = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else body.get("detail")
    except (ValueError, AttributeError):
        msg = None
    return str(msg or r.text.strip() or r.reason_phrase)[:300]


def transient(status: int) -> bool:
    return status in (408, 429) or status >= 500


async def post_json(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    """POST ``body`` and return the JSON answer, retrying transient failures (module docstring)."""
    last = ""
    for attempt in range(RETRIES + 1):
        try:
            r = await client.post(url, json=body)
        except httpx.TransportError as e:  # refused, reset, timed out
            last = f"{type(e).__name__}: {e}".rstrip(": ")
        else:
            if r.status_code == 200:
                try:
                    return r.json()
                except ValueError:
                    raise EagletError(f"{url} answered HTTP 200 with a body that is not JSON") from None
            if not transient(r.status_code):
                raise EagletError(f"{url} refused the request with HTTP {r.status_code}: {server_message(r)}")
            last = f"HTTP {r.status_code}: {server_message(r)}"
        if attempt < RETRIES:
            await asyncio.sleep(BACKOFF_S * 2**attempt)
    raise EagletError(f"{url} failed {RETRIES + 1} times in a row, the last time with {last}")
