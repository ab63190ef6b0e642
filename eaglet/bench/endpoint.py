"""``eaglet bench --endpoint URL``: load-test any OpenAI-compatible server from the client side.

Requests are streamed chat completions (``stream_options.include_usage`` gives the token
counts), sent at a fixed ``concurrency`` (at most that many in flight) and/or a Poisson
``request_rate`` (requests per second; seeded), the way serving benchmarks do. Per request:
time to first token (TTFT), the gaps between streamed chunks (inter-token latency, ITL;
a speculative server sends several tokens per chunk), end-to-end latency and completion
tokens. The summary: output tok/s over the wall time of the whole run, TTFT and ITL
median and p99, and failed requests (HTTP errors, error events, broken streams).

The client is aiohttp, as in SGLang's and vLLM's serving benchmarks: at concurrency 1 every
microsecond the client spends on a request (sending it, reading the stream to its end) is on
the measured path. Against the server over a fake engine (scripts/http_overhead.py) on the
H200's host, httpx took ~0.6 ms more a request (docs/performance.md, session 22).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from eaglet.bench.prompts import load_prompt_sets
from eaglet.bench.report import save_png, write_json
from eaglet.openai_client import api_base, served_model
from eaglet.options import EndpointBenchConfig

JSON = {"Content-Type": "application/json"}


@dataclass
class Result:
    ok: bool = False
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    text: str = ""
    ttft: float | None = None  # seconds from sending to the first content chunk
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)  # gaps between content chunks


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> Result:
    res, start = Result(), time.perf_counter()
    last, parts = start, []
    try:
        async with session.post(url, data=body, headers=JSON) as r:
            if r.status != 200:
                res.error = f"HTTP {r.status}: {(await r.read()).decode(errors='replace')[:200]}"
                return res
            async for raw in r.content:  # one line at a time
                if not raw.startswith(b"data: ") or raw.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(raw[6:])
                if "error" in chunk:
                    res.error = str(chunk["error"].get("message"))
                    return res
                if chunk.get("usage"):
                    res.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    res.completion_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        now = time.perf_counter()
                        if res.ttft is None:
                            res.ttft = now - start
                        else:
                            res.itl.append(now - last)
                        last = now
                        parts.append(text)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:  # ValueError: JSON, a line too long
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.latency, res.text, res.ok = time.perf_counter() - start, "".join(parts), True
    return res


async def _run(cfg: EndpointBenchConfig, conversations: list[list[dict]], model: str
               ) -> tuple[list[Result], float]:
    url = f"{api_base(cfg.endpoint)}/chat/completions"
    connector = aiohttp.TCPConnector(limit=cfg.concurrency or 0)  # 0: no limit
    # No total limit (a long answer may stream for minutes): 600 s at most between reads. A line of the
    # stream may hold many tokens (a chunk that coalesced several steps): a 1 MiB buffer reads it whole.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=2**20) as session:
        gate = asyncio.Semaphore(cfg.concurrency or len(conversations))
        rng = random.Random(cfg.seed)

        async def limited(messages):
            # The body is encoded before the request's turn: at concurrency 1 the time between one answer's end
            # and the next request is on the measured path.
            body = json.dumps({"model": model, "messages": messages, "max_tokens": cfg.max_tokens,
                               "temperature": cfg.temperature, "stream": True,
                               "stream_options": {"include_usage": True}}).encode()
            async with gate:
                return await _one(session, url, body)

        start, tasks = time.perf_counter(), []
        for messages in conversations:
            tasks.append(asyncio.create_task(limited(messages)))
            if cfg.request_rate is not None:
                await asyncio.sleep(rng.expovariate(cfg.request_rate))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - start


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 5)


def summarize(results: list[Result], seconds: float) -> dict:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [g for r in ok for g in r.itl]
    tokens = sum(r.completion_tokens for r in ok)
    return {
        "requests": len(results), "failed": len(results) - len(ok), "seconds": round(seconds, 3),
        "completion_tokens": tokens, "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "output_tok_per_s": round(tokens / seconds, 2) if seconds > 0 else 0.0,
        "requests_per_s": round(len(ok) / seconds, 3) if seconds > 0 else 0.0,
        "ttft_s": {"median": _pct(ttft, 0.5), "p99": _pct(ttft, 0.99)},
        "itl_s": {"median": _pct(itl, 0.5), "p99": _pct(itl, 0.99)},
        "latency_s": {"median": _pct([r.latency for r in ok], 0.5), "p99": _pct([r.latency for r in ok], 0.99)},
        "errors": sorted({r.error for r in results if r.error})[:10],
    }


def _png(results: list[Result], summary: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ok = [r for r in results if r.ok]
    a.hist([r.ttft for r in ok if r.ttft is not None], bins=30)
    a.set(title=f"time to first token (median {summary['ttft_s']['median']} s)", xlabel="s", ylabel="requests")
    b.hist([1000 * g for r in ok for g in r.itl], bins=30)
    b.set(title=f"inter-token latency (median {summary['itl_s']['median']} s)", xlabel="ms", ylabel="chunks")
    fig.suptitle(f"{summary['output_tok_per_s']} output tok/s, {summary['requests']} requests, "
                 f"{summary['failed']} failed")
    return save_png(fig, out)


def run_endpoint_bench(cfg: EndpointBenchConfig) -> dict:
    conversations = [p.messages for p in load_prompt_sets(cfg.prompts, cfg.limit)]
    base = api_base(cfg.endpoint)
    print(f"eaglet: {len(conversations)} requests to {base} (concurrency {cfg.concurrency or 'unlimited'}, "
          f"rate {cfg.request_rate or 'unlimited'}/s)", file=sys.stderr)
    model = served_model(base, cfg.model)
    results, seconds = asyncio.run(_run(cfg, conversations, model))
    summary = summarize(results, seconds)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"config": {**asdict(cfg), "model": model}, "summary": summary,
              "requests": [{k: v for k, v in asdict(r).items() if k != "itl"} for r in results]}
    write_json(report, out)
    _png(results, summary, out)
    print(json.dumps(summary))
    return report
