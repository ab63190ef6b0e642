"""Where the engine's thread spends the time between speculative iterations: runs any eaglet command with
the iteration, the session's step and (in a server) the scheduler's parts wrapped in timers, and prints
one table to stderr at exit.

    PYTHONPATH=. python scripts/iteration_trace.py serve --target /tmp/smol.gguf --batch-sizes 1 --warm-up
    PYTHONPATH=. python scripts/iteration_trace.py bench --target /tmp/smol.gguf --prompts builtin --limit 64 \\
        --methods spec --batch-size 1 --out runs/trace-offline

As `scripts/serve_matrix.sh`'s server: SERVE="python3 scripts/iteration_trace.py serve". On the H200 a
request at concurrency 1 took ~0.25 ms more an iteration served than offline (docs/performance.md, session
21), where both run the same `SpecSession.step`: the table sets the two side by side. Rows:

- ``launch``: an iteration's host work until its device work is queued (its noise, the graph's replay, the
  packed result's copy); ``wait``: from there until the host has the result (the GPU's time, mostly);
- ``iteration``: both; ``session step``: the iteration and the session's bookkeeping (stops, the policy);
- ``session admit``: a prompt's admission (its prefill, ``prefill``, then the first token's bookkeeping), the
  same call offline and served (session 22: 4.3 ms a request served on the H200, offline not yet split);
  offline, every row counts from the start of the bench's timed loop (its warm-up left out);
- ``turn step``, ``admit``, ``flush``, ``drop cancelled``: the server scheduler's parts of a turn;
- ``between iterations``: from one iteration's end to the next one's start within a request (gaps over
  20 ms, between requests, left out): everything the host does outside the iteration.

A wrapper adds ~1 us a timed call; the medians are the point.
"""

from __future__ import annotations

import atexit
import statistics
import sys
import time

from eaglet.bench import run as bench_run
from eaglet.cli import main
from eaglet.serve.scheduler import Scheduler
from eaglet.speculative.engine import _Iteration
from eaglet.speculative.session import SpecSession

SPANS: dict[str, list[float]] = {}  # label -> durations (s)
ITERATIONS: list[tuple[float, float]] = []  # (start, end) of each iteration, in order
BETWEEN_LIMIT = 0.020  # a longer gap is between requests, not between iterations


def _timed(cls, name: str, label: str) -> None:
    inner = getattr(cls, name)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SPANS.setdefault(label, []).append(time.perf_counter() - t0)

    setattr(cls, name, timed)


def _trace_iterations() -> None:
    inner = _Iteration.__call__

    def call(self, gen, launched=None):
        t0 = time.perf_counter()
        queued = []

        def hook():
            queued.append(time.perf_counter())
            if launched is not None:
                launched()

        try:
            return inner(self, gen, hook)
        finally:
            t1 = time.perf_counter()
            ITERATIONS.append((t0, t1))
            SPANS.setdefault("iteration", []).append(t1 - t0)
            if queued:
                SPANS.setdefault("launch", []).append(queued[0] - t0)
                SPANS.setdefault("wait", []).append(t1 - queued[0])

    _Iteration.__call__ = call


def _from_the_timed_loop() -> None:
    """Offline, keep only what the bench's timed loop records: its warm-up and shape pass admit prompts of their
    own (session 23: 65 of an offline run's 129 admissions), whose spans would mix into the medians."""
    inner = bench_run.tqdm

    def started(*args, **kwargs):
        SPANS.clear()
        ITERATIONS.clear()
        return inner(*args, **kwargs)

    bench_run.tqdm = started


def report() -> None:
    gaps = [b[0] - a[1] for a, b in zip(ITERATIONS, ITERATIONS[1:]) if b[0] - a[1] < BETWEEN_LIMIT]
    rows = {**SPANS, "between iterations": gaps}
    print(f"\n{'span':<20}{'count':>8}{'median us':>11}{'mean us':>10}", file=sys.stderr)
    for label in ("launch", "wait", "iteration", "session step", "session admit", "prefill", "turn step", "admit",
                  "flush", "drop cancelled", "between iterations"):
        got = rows.get(label)
        if got:
            print(f"{label:<20}{len(got):>8}{1e6 * statistics.median(got):>11.1f}{1e6 * statistics.fmean(got):>10.1f}",
                  file=sys.stderr)


if __name__ == "__main__":
    _trace_iterations()
    _from_the_timed_loop()
    _timed(SpecSession, "step", "session step")
    _timed(SpecSession, "admit", "session admit")
    _timed(SpecSession, "_prefill", "prefill")
    for name, label in (("_step", "turn step"), ("_admit", "admit"), ("_flush", "flush"),
                        ("_drop_cancelled", "drop cancelled")):
        _timed(Scheduler, name, label)
    atexit.register(report)
    sys.exit(main(sys.argv[1:]))
