"""What the HTTP path adds to a request at concurrency 1, with no model: the real app and scheduler over a fake
engine whose prefill and steps sleep (the GIL released, as while a GPU computes), measured by
`eaglet bench --endpoint` in a process of its own.

    PYTHONPATH=. python scripts/http_overhead.py --tokenizer DIR [--prefill-ms 4 --step-ms 1.6 --steps 20]

DIR holds a chat tokenizer (a converted GGUF's cache directory will do: ~/.cache/eaglet/<name>). Each run
sends the first ``--requests`` bench prompts one after another; a request's answer is ``--steps`` steps of
``--tokens-per-step`` tokens. The overhead a request is the run's wall time less the time the fake engine
slept (measured, so a late wake-up of the sleeping thread is not counted as overhead), over the
requests: sending, parsing and tokenizing the request, the scheduler's turns, the hand-off of each
step's tokens to the HTTP thread, the stream's writes and the client's reading. "Between steps" is the
scheduler's turn alone: from one step's end to the next one's start within a request. ``--stages`` also
times each request's way through the server (medians over every run's requests): the app's ingress (body,
validation) to the template, the template, the tokenizer, the hand-off to the engine, the first and the last
step's events to their writes, and the client's turnaround from the last write to the next request. On the H200 a served
request at concurrency 1 took ~5.5 ms more than offline (docs/performance.md, session 22); this
isolates the part no GPU is needed to study.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types

from eaglet.generate import Completion

STAGES = [  # (what, from mark, to mark): the marks a request's dict collects when --stages is on
    ("ingress: body, routing, validation", "arrived", "template"),
    ("chat template", "template", "tokenize"),
    ("tokenizer", "tokenize", "tokenized"),
    ("hand-off to the engine", "tokenized", "admit"),
    ("the first events to their write", "admitted", "first_write"),
    ("the last step's events to their write", "last_step", "last_write"),
]


class Stages:
    """Timestamps of each request's way through the server (the requests come one at a time)."""

    def __init__(self):
        self.requests: list[dict[str, float]] = []

    def mark(self, name: str, new: bool = False) -> None:
        if new:
            self.requests.append({})
        if self.requests:
            self.requests[-1].setdefault(name, time.perf_counter())

    def last(self, name: str) -> None:
        if self.requests:
            self.requests[-1][name] = time.perf_counter()

    def report(self) -> None:
        done = [r for r in self.requests if "last_write" in r]
        for what, a, b in STAGES:
            print(f"  {what:<40} {statistics.median(r[b] - r[a] for r in done) * 1e3:7.3f} ms")
        turn = [n["arrived"] - r["last_write"] for r, n in zip(done, done[1:])]
        print(f"  {'the client: last write to next request':<40} {statistics.median(turn) * 1e3:7.3f} ms")


class TimedTokenizer:
    """The tokenizer, with the template's and the encoding's start marked."""

    def __init__(self, tok, stages: Stages):
        self._tok, self._stages = tok, stages

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def apply_chat_template(self, *args, **kwargs):
        self._stages.mark("template")
        return self._tok.apply_chat_template(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return self._timed(self._tok, *args, **kwargs)

    def _timed(self, encode, *args, **kwargs):
        self._stages.mark("tokenize")
        out = encode(*args, **kwargs)
        self._stages.mark("tokenized")
        return out

    @property
    def backend_tokenizer(self):  # ``chat.encode_text`` encodes through it
        return _TimedBackend(self._tok.backend_tokenizer, self._timed)


class _TimedBackend:
    """The Rust tokenizer, its encoding marked as the tokenizer's is."""

    def __init__(self, backend, timed):
        self._backend, self._timed = backend, timed

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def encode(self, *args, **kwargs):
        return self._timed(self._backend.encode, *args, **kwargs)

    def encode_batch_fast(self, *args, **kwargs):  # what ``chat.encode_text`` calls since session 40
        return self._timed(self._backend.encode_batch_fast, *args, **kwargs)


def timed_app(app, stages: Stages):
    """The ASGI app, marking a chat request's arrival and its body's first and last write."""
    async def wrapped(scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            return await app(scope, receive, send)
        stages.mark("arrived", new=True)

        async def timed_send(message):
            if message["type"] == "http.response.body":
                stages.mark("first_write")
                if not message.get("more_body", False):
                    stages.mark("last_write")
            await send(message)

        await app(scope, receive, timed_send)
    return wrapped


class FakeSession:
    """The part of ``Session`` the scheduler uses, at batch 1: admit and step sleep, tokens are made up."""

    batch = 1

    def __init__(self, params, args, slept: list[float], words: list[int], gaps: list[float], stages: Stages):
        self.params, self.args, self.slept, self.words, self.gaps = params, args, slept, words, gaps
        self.stages = stages
        self.last_end: float | None = None  # when the last step ended (None before a request's first step)
        self.rows: dict[int, types.SimpleNamespace] = {}
        self.verifies = self.accepted = 0
        self.last_step = "spec"

    def _sleep(self, ms: float) -> None:
        t0 = time.perf_counter()
        time.sleep(ms / 1e3)
        self.slept.append(time.perf_counter() - t0)

    def free_rows(self) -> list[int]:
        return [i for i in range(self.batch) if i not in self.rows]

    def check_prompt(self, prompt: list[int]) -> None:
        pass

    def admit(self, rows, prompts, params) -> list[list[int]]:
        self.stages.mark("admit")
        self._sleep(self.args.prefill_ms)
        self.stages.mark("admitted")
        for r in rows:
            self.rows[r] = types.SimpleNamespace(n=0, done=False, tokens=[100])
        return [[100] for _ in rows]

    def step(self, launched=None) -> dict[int, list[int]]:
        if self.last_end is not None:
            self.gaps.append(time.perf_counter() - self.last_end)
        if launched is not None:
            launched()
        self._sleep(self.args.step_ms)
        k, out = self.args.tokens_per_step, {}
        for i, row in self.rows.items():
            row.n += 1
            out[i] = [self.words[(row.n * k + j) % len(self.words)] for j in range(k)]
            row.tokens += out[i]
            row.done = row.n >= self.args.steps
            self.verifies, self.accepted = self.verifies + 1, self.accepted + k
        self.last_end = time.perf_counter()
        self.stages.last("last_step")
        return out

    def release(self, row: int) -> Completion:
        return Completion(self.rows.pop(row).tokens, "length")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="a directory with a chat tokenizer")
    ap.add_argument("--prefill-ms", type=float, default=4.0)
    ap.add_argument("--step-ms", type=float, default=1.6)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tokens-per-step", type=int, default=5)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--loop", default="auto", choices=["auto", "asyncio", "uvloop"], help="uvicorn's event loop")
    ap.add_argument("--stages", action="store_true", help="also time each request's stages in the server")
    args = ap.parse_args()

    import uvicorn
    from transformers import AutoTokenizer

    from eaglet.serve.app import build_app
    from eaglet.serve.metrics import Metrics
    from eaglet.serve.scheduler import Scheduler

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    stages = Stages()
    slept: list[float] = []
    gaps: list[float] = []  # from one step's end to the next one's start, within a request: the scheduler's turn
    words = tok("an answer of ordinary words, one piece at a time, " * 8, add_special_tokens=False)["input_ids"]
    target = types.SimpleNamespace(tokenizer=TimedTokenizer(tok, stages) if args.stages else tok, name="fake",
                                   config=types.SimpleNamespace(vocab_size=len(tok)))
    engine = types.SimpleNamespace(target=target, capacity=1 << 20, use_graphs=False,
                                   session=lambda size, params: FakeSession(params, args, slept, words, gaps, stages))
    metrics = Metrics()
    app = build_app(engine, Scheduler(engine, 1, 64, metrics, (1,)), metrics, "fake")
    if args.stages:
        app = timed_app(app, stages)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", loop=args.loop))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    print("run   wall ms   engine ms   overhead ms/request   client TTFT median ms   ok")
    overheads = []
    try:
        for i in range(args.reps):
            slept.clear()  # runs follow one another: what the engine sleeps from here is this run's
            with tempfile.TemporaryDirectory() as out:  # `eaglet bench --endpoint` itself, a process a run
                run = subprocess.run([sys.executable, "-m", "eaglet.cli", "bench", "--endpoint", url, "--prompts",
                                      "builtin", "--limit", str(args.requests), "--concurrency", "1", "--out", out],
                                     capture_output=True, text=True)
            lines = run.stdout.strip().splitlines()
            if not lines or not lines[-1].startswith("{"):
                sys.exit(f"the client failed: {run.stderr[-1000:]}")
            summary, engine_s = json.loads(lines[-1]), sum(slept)
            overheads.append((summary["seconds"] - engine_s) / args.requests)
            print(f"{i:>3} {summary['seconds'] * 1e3:9.1f} {engine_s * 1e3:11.1f} {overheads[-1] * 1e3:21.2f} "
                  f"{summary['ttft_s']['median'] * 1e3:23.2f}   {summary['requests'] - summary['failed']}")
    finally:  # a daemon thread still serving at interpreter exit can crash it
        server.should_exit = True
        thread.join(10)
    print(f"median overhead a request: {statistics.median(overheads) * 1e3:.2f} ms (loop {args.loop}); "
          f"between steps, median: {statistics.median(gaps) * 1e6:.1f} us")
    if args.stages:
        print("a request's stages in the server, medians:")
        stages.report()


if __name__ == "__main__":
    main()
