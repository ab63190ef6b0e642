"""Continuous batching: one worker thread runs the model; requests join and leave between steps.

The HTTP handlers live on the asyncio loop and never touch the model. ``submit`` puts a
request in a bounded FIFO (full: ``QueueFull``, answered 429); the worker admits every waiting
request that can join into free rows of the running session, all in one prefill, runs one
step (a speculative iteration or a plain step) of every running row, and hands each request
its new tokens through an asyncio queue. A finished, aborted (client gone) or failed row is
released at once and its row refilled at the next admission.

Batch size: a batch opens with rows for the requests waiting then: the smallest of the
allowed ``sizes`` that holds them (by default the powers of two below ``max_batch``, and
``max_batch``), so a lone request decodes at batch 1 with batch 1's tree. A full batch
with requests waiting grows in place: a session of the smallest size that holds its rows and
the queue adopts its rows (``Session.adopt``: their cache slots copied, the same row
indices) and the waiting requests join the free rows; only a full batch of ``max_batch``
rows (or a growth that failed, say for memory) makes them wait for rows to free. On an
H200, a burst of 64 requests had waited ~0.4 s each for the lone first one's batch of 1 to
drain. An empty batch is not kept: the next request opens one sized for the queue at that
time. Fewer sizes mean fewer compiled graphs (each size builds its own) and more padding.

Sampling rule: rows of one session share temperature, top-p and top-k (the engine's
iteration is compiled per setting); a request whose setting differs from the running
batch's waits at the head of the queue until that batch drains, then starts the next
session. A sampled request with a ``seed`` runs alone in a session seeded with it, so its
answer is reproducible; greedy requests ignore ``seed``.

Hand-off: the worker posts a step's tokens to the loop in one wake-up. With ``overlap`` (an
experiment, off) it posts them once the next step's device work is queued, so that the loop
thread's sending runs while the GPU computes instead of taking the GIL while the worker prepares
the next launch (the GIL passes at every torch call). A worker about to wait for requests posts
what is left first. On the H200 at concurrency 1 it made no difference beyond the noise.

Faults: a prompt the context cannot hold is refused by the handler (400 ``context_length_exceeded``); the
scheduler's own check before the prefill (500, that request alone) is a fallback; when
the prefill of requests admitted together raises, each is admitted alone, so only a request
at fault fails (500); an exception inside a step fails the rows of that step's batch, whose
caches are then discarded, and the worker goes on with a fresh session.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from eaglet.sampling import SamplingParams
from eaglet.serve.metrics import Metrics
from eaglet.session import Session, same_sampling


def default_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """The powers of two below ``max_batch``, and ``max_batch``."""
    return tuple(1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch) + (max_batch,)


class QueueFull(Exception):
    pass


class ShuttingDown(Exception):
    pass


@dataclass(frozen=True)
class Failure:
    """The end of a request that did not finish: HTTP status and message."""

    status: int
    message: str


@dataclass(eq=False)
class Request:
    prompt: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    # list[int] (new tokens), then a Completion or a Failure; filled from the worker thread.
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False  # set by the handler when the client disconnects; read between steps
    arrival: float = field(default_factory=time.perf_counter)
    last: float | None = None  # when the last tokens were made
    held: list[int] = field(default_factory=list)  # tokens made but not yet sent (the stream interval)

    def emit(self, event) -> None:
        _post(self.loop, [(self, event)])

    @property
    def exclusive(self) -> bool:
        return not self.params.greedy and self.params.seed is not None


def _post(loop: asyncio.AbstractEventLoop, events: list[tuple[Request, object]]) -> None:
    """Hand ``events`` to their requests' queues on ``loop``, in order, with one wake-up of the loop."""
    try:
        loop.call_soon_threadsafe(_put_all, events)
    except RuntimeError:  # the loop is closed: nobody is listening any more
        pass


def _put_all(events: list[tuple[Request, object]]) -> None:
    for req, event in events:
        req.events.put_nowait(event)


class Scheduler:
    def __init__(self, engine, max_batch: int, max_queue: int, metrics: Metrics,
                 sizes: tuple[int, ...] | None = None, stream_interval: int = 1, overlap: bool = False):
        self.engine, self.max_queue, self.metrics = engine, max_queue, metrics
        self.stream_interval, self.overlap = stream_interval, overlap
        self.sizes = tuple(sorted(sizes)) if sizes else default_batch_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        self.waiting: deque[Request] = deque()
        self.wake = threading.Condition()
        self.session: Session | None = None
        self.rows: dict[int, Request] = {}  # row of the running session -> its request
        # Events of the rows' requests since the last flush: an admission's or a step's go to the loop
        # together, in one wake-up (one per request and step had the loop thread take the GIL that often).
        self.outbox: list[tuple[Request, object]] = []
        self.launched = False  # overlap: this turn's step posted the outbox at its launch
        self.step_counters: dict[str, object] = {}  # metrics.steps' child per kind of step
        self.draining = False  # growing the full running batch failed: it drains, then a larger one opens
        self.accepting = True
        self.deadline: float | None = None  # after close(): running rows are aborted past it
        self.thread = threading.Thread(target=self._work, name="eaglet-engine", daemon=True)
        self.thread.start()

    # --- the asyncio side ---

    def submit(self, req: Request) -> None:
        with self.wake:
            if not self.accepting:
                raise ShuttingDown
            if len(self.waiting) >= self.max_queue:
                raise QueueFull
            self.waiting.append(req)
            self.metrics.queue_depth.set(len(self.waiting))
            self.wake.notify()

    def close(self, grace_s: float) -> None:
        """Stop admitting: waiting requests get 503; running rows may finish for ``grace_s`` seconds."""
        with self.wake:
            self.accepting = False
            self.deadline = time.monotonic() + grace_s
            self.wake.notify()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    # --- the worker thread ---

    def _work(self) -> None:
        with torch.inference_mode():
            while True:
                self.launched = False
                with self.wake:
                    if not self.accepting:
                        self._reject_waiting()
                        if not self.rows:
                            self._flush()
                            return
                    elif not self.rows and not self.waiting:
                        self._flush()
                        self.wake.wait(0.5)
                        continue
                self._drop_cancelled()
                self._admit()
                if not self.overlap:
                    self._flush()
                if self.deadline is not None and time.monotonic() > self.deadline:
                    for row in list(self.rows):
                        self._end(row, Failure(503, "the server is shutting down"), "shutdown")
                elif self.rows:
                    self._step()
                if not self.launched:  # else this step's tokens go at the next launch, or before waiting
                    self._flush()

    def _launched(self) -> None:
        """The step's device work is queued: post the previous turn's events while it runs."""
        self.launched = True
        self._flush()

    def _flush(self) -> None:
        if not self.outbox:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for req, event in self.outbox:
            by_loop.setdefault(req.loop, []).append((req, event))
        self.outbox = []
        for loop, events in by_loop.items():
            _post(loop, events)

    def _reject_waiting(self) -> None:
        while self.waiting:
            self.waiting.popleft().emit(Failure(503, "the server is shutting down"))
            self.metrics.requests.labels("shutdown").inc()
        self.metrics.queue_depth.set(0)

    def _drop_cancelled(self) -> None:
        for row, req in list(self.rows.items()):
            if req.cancelled:
                self._end(row, None, "aborted")

    def _head(self) -> Request | None:
        """The first waiting request not cancelled (cancelled ones are dropped on the way); hold ``wake``."""
        while self.waiting and self.waiting[0].cancelled:
            self.waiting.popleft()
            self.metrics.requests.labels("aborted").inc()
        return self.waiting[0] if self.waiting else None

    def _take(self) -> list[Request]:
        """The waiting requests that join the running session now (opening one if needed): the head of the
        queue and those after it that share its session, up to the free rows, in order."""
        with self.wake:
            req = self._head()
            if req is None:
                return []
            s = self.session
            joins = s is not None and bool(s.rows) and not self.draining and not req.exclusive \
                and same_sampling(req.params, s.params) and not (s.params.seed is not None and not s.params.greedy)
            grow_to = None
            if joins and not s.free_rows():
                if s.batch == self.max_batch:
                    return []  # rows free as requests finish
                grow_to = next((n for n in self.sizes if n >= len(s.rows) + len(self.waiting)), self.max_batch)
            elif not joins and self.rows:
                return []  # another sampling setting, or a larger batch, waits for this one to drain
            if grow_to is None:
                size = self.sizes[0] if req.exclusive else next(
                    (n for n in self.sizes if n >= len(self.waiting)), self.max_batch)
                room = len(s.free_rows()) if joins else size
                group = [self.waiting.popleft()]
                while len(group) < room and not req.exclusive and (nxt := self._head()) is not None \
                        and not nxt.exclusive and same_sampling(nxt.params, req.params):
                    group.append(self.waiting.popleft())
                self.metrics.queue_depth.set(len(self.waiting))
        if grow_to is not None:
            return self._grow(s, grow_to)
        if not joins:
            self.draining = False
            try:
                self.session = self.engine.session(size, req.params)
            except Exception as e:  # e.g. no memory for the caches: this request fails, the next may not
                with self.wake:
                    self.waiting.extendleft(reversed(group[1:]))
                self._fail(req, e, "opening a batch")
                return self._take()
            self.metrics.batch_rows.set(size)
        return group

    def _grow(self, small: Session, size: int) -> list[Request]:
        """Move the full running batch's rows into a session of ``size`` rows, then take the waiting
        requests that join it; if that fails the small batch goes on and drains first."""
        try:
            big = self.engine.grow(small, size)
        except Exception as e:  # noqa: BLE001  (e.g. no memory for the larger caches: the rows go on as they are)
            print(f"eaglet: growing the batch from {small.batch} to {size} rows failed ({e!r}); the waiting "
                  "requests wait for it to drain", file=sys.stderr)
            self.draining = True
            return []
        self.session = big
        self.metrics.batch_rows.set(size)
        return self._take()

    def _fail(self, req: Request, e: Exception, where: str) -> None:
        print(f"eaglet: a request failed while {where}: {e!r}", file=sys.stderr)
        req.emit(Failure(500, f"internal error: {e}"))
        self.metrics.requests.labels("error").inc()

    def _admit(self) -> None:
        """Admit every waiting request that can join, in one prefill a group; a prompt the context cannot
        hold fails alone, before the prefill."""
        if not self.waiting:  # read without the lock: a request queued just now joins at the next turn
            return
        while group := self._take():
            fits = []
            for req in group:
                try:
                    self.session.check_prompt(req.prompt)
                    fits.append(req)
                except Exception as e:  # noqa: BLE001  (reported to its request; the others go on)
                    self._fail(req, e, "admitting")
            if fits:
                self._flush()  # a prefill would hold the last step's tokens back
                self._join(fits)
        self.metrics.running.set(len(self.rows))

    def _join(self, reqs: list[Request]) -> None:
        """Prefill ``reqs`` into free rows in one call; if it fails, each alone, so that only a request at
        fault fails (a free row's half-written cache is never read: the next prefill there resets it)."""
        s = self.session
        rows = s.free_rows()[: len(reqs)]
        try:
            firsts = s.admit(rows, [r.prompt for r in reqs], [r.params for r in reqs])
        except Exception as e:  # noqa: BLE001  (these requests' failure: report it, keep serving)
            for row in rows:
                if row in s.rows:
                    s.release(row)
            if len(reqs) == 1:
                self._fail(reqs[0], e, "admitting")
                return
            print(f"eaglet: admitting {len(reqs)} requests together failed ({e!r}); admitting each alone",
                  file=sys.stderr)
            for req in reqs:
                self._join([req])
            return
        now = time.perf_counter()
        for row, req, first in zip(rows, reqs, firsts):
            self.rows[row] = req
            self.metrics.prompt_tokens.inc(len(req.prompt))
            self._deliver(row, first, now)
        self.metrics.generated_tokens.inc(sum(map(len, firsts)))

    def _step(self) -> None:
        s = self.session
        before = (s.verifies, s.accepted)
        try:
            news = s.step(self._launched if self.overlap else None)
        except Exception as e:
            print(f"eaglet: a batch step failed: {e!r}; failing its {len(self.rows)} rows", file=sys.stderr)
            for row in list(self.rows):
                self._end(row, Failure(500, f"internal error: {e}"), "error")
            self.session = None  # its caches may be half-written
            return
        self._step_counter(s.last_step).inc()
        self.metrics.verifies.inc(s.verifies - before[0])
        self.metrics.accepted.inc(s.accepted - before[1])
        now, made = time.perf_counter(), 0  # one clock read and one counter update a step, not one a row
        for row, toks in news.items():
            made += len(toks)
            self._deliver(row, toks, now)
        self.metrics.generated_tokens.inc(made)

    def _step_counter(self, kind: str):
        """The step counter of ``kind``, looked up once (``labels`` takes a lock and builds a key each call)."""
        if kind not in self.step_counters:
            self.step_counters[kind] = self.metrics.steps.labels(kind)
        return self.step_counters[kind]

    def _deliver(self, row: int, toks: list[int], now: float) -> None:
        """Hand ``row``'s new tokens, made at ``now``, to its request (held back up to the stream interval);
        release the row if it is done. The caller counts the tokens generated."""
        req = self.rows[row]
        if toks:
            first = req.last is None
            if first:
                self.metrics.ttft.observe(now - req.arrival)
            else:
                self.metrics.itl.observe((now - req.last) / len(toks), len(toks))
            req.last = now
            req.held += toks
            if first or len(req.held) >= self.stream_interval:
                self.outbox.append((req, req.held))
                req.held = []
        if self.session.rows[row].done:
            self._end(row, None, "finished")

    def _end(self, row: int, failure: Failure | None, outcome: str) -> None:
        """Release a row now and tell its request how it ended."""
        req = self.rows.pop(row)
        done = self.session.release(row) if self.session and row in self.session.rows else None
        if outcome != "aborted":
            if req.held:
                self.outbox.append((req, req.held))
            self.outbox.append((req, failure or done))
        self.metrics.requests.labels(outcome).inc()
        self.metrics.running.set(len(self.rows))
