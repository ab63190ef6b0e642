"""Tree sizes per device and batch, and the rule that keeps speculation from being slower.

Defaults (a table, largest tree first). A verify of N nodes costs about as much as
one plain step while the target is launch- or bandwidth-bound (small N, small batch,
GPU) and about N times as much once it is compute-bound (CPU, large batches); big trees
pay off only in the first regime.

The rule judges on evidence, never on one prompt's first iterations:
- costs are measured once per engine, batch size and tree: a plain step as plain decoding
  runs it (under CUDA graphs a chunk of steps per host read, per step) and one whole
  iteration, each timed with every row inactive (nothing is committed);
- acceptance is tracked per batch size over the iterations since the tree was chosen,
  across calls; a decision needs ``WINDOW`` iterations spanning at least two calls, or
  ``LONG_WINDOW`` iterations of one, and is taken again every ``WINDOW`` iterations;
- the speed of a tree over plain decoding is the time plain steps would take for the tokens
  each row emitted over the time the iterations took, as they ran: wall time of the
  iteration and its host bookkeeping (at batch 64 on an H200 the replay alone looked
  cheaper than it ran: 0.89x end to end). Before any window, the measured iteration stands
  in for it (the accept length seen on a larger tree times the plain step over the
  iteration). Below 1 the policy steps down the table, skipping
  trees that could not win even at the acceptance just seen (a smaller tree accepts no
  more), and below the smallest to plain decoding;
- after ``RETRY_PLAIN_STEPS`` plain steps, speculation is tried again from the top (a running session first
  rebuilds its rows' draft cache: ``SpecSession._resume``);
- a step down lands only on a tree that is ``ready`` (the engine's word: a compiling engine's
  tree is ready once its iteration is compiled and captured), skipping the others, else on plain
  decoding, which is always built. Building a tree compiles for about a minute on an H200, and
  every running row would wait: a server's batch-16 run stalled twice that way (docs/performance.md).
Each decision is printed with its numbers. With an explicit tree
(``--num-steps/--tree-topk/--num-draft-tokens``) the only step down is to plain decoding.

Under tensor parallelism each rank times its own steps, so each would decide
differently; ``agree`` turns a rank's decision into rank 0's (a broadcast), and every
rank switches at the same iteration.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from eaglet.speculative.tree import TreeConfig

WINDOW = 64
LONG_WINDOW = 256
RETRY_PLAIN_STEPS = 4096

# (largest batch size, tree); the first row whose batch bound holds is the default and
# the rows below it are the steps down.
TABLE = {
    "cuda": [
        (1, TreeConfig(6, 8, 48)),
        (2, TreeConfig(6, 6, 32)),
        (4, TreeConfig(5, 4, 24)),
        (8, TreeConfig(5, 4, 16)),
        (16, TreeConfig(4, 2, 10)),
        (32, TreeConfig(3, 2, 6)),
        (64, TreeConfig(3, 1, 4)),
        (None, TreeConfig(2, 1, 3)),
    ],
    "cpu": [
        (1, TreeConfig(5, 2, 8)),
        (4, TreeConfig(4, 1, 5)),
        (None, TreeConfig(3, 1, 4)),
    ],
}


def default_ladder(device_type: str, batch: int) -> list[TreeConfig]:
    rows = TABLE["cuda" if device_type == "cuda" else "cpu"]
    start = next(i for i, (bound, _) in enumerate(rows) if bound is None or batch <= bound)
    return [cfg for _, cfg in rows[start:]]


@dataclass
class _Track:
    """Per batch size: where on the ladder, and the evidence since the tree was chosen."""

    rung: int = 0
    window: deque = field(default_factory=lambda: deque(maxlen=LONG_WINDOW))  # (tokens, active rows, seconds)
    iters: int = 0  # iterations on this rung (the window keeps the last LONG_WINDOW)
    calls: int = 0  # generate calls seen on this rung
    plain_steps: int = 0  # since falling back
    accept_bound: float | None = None  # accept length seen on a larger tree: a smaller one accepts no more


class BatchPolicy:
    def __init__(self, device_type: str, fixed: TreeConfig | None, adaptive: bool,
                 log: Callable[[str], None], agree: Callable[[bool], bool] = bool,
                 ready: Callable[[int, TreeConfig], bool] = lambda _b, _cfg: True):
        self.device_type, self.fixed, self.adaptive, self.log = device_type, fixed, adaptive, log
        self.agree = agree  # a per-rank decision -> the one all ranks take (identity at tp=1)
        self.ready = ready  # (batch, tree) -> whether switching to it builds nothing (the same on every rank)
        self._ladders: dict[int, list[TreeConfig]] = {}
        self._track: dict[int, _Track] = {}
        self.plain_step_s: dict[int, float] = {}  # measured by the engine
        self.iteration_s: dict[tuple[int, TreeConfig], float] = {}

    def ladder(self, batch: int) -> list[TreeConfig]:
        if batch not in self._ladders:
            self._ladders[batch] = [self.fixed] if self.fixed else default_ladder(self.device_type, batch)
            how = "as given" if self.fixed else f"automatic for {self.device_type} batch {batch}"
            self.log(f"tree {self._ladders[batch][0].describe()} ({how})")
        return self._ladders[batch]

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Book no evidence and change no tree inside (a warm-up's first iterations are no sample of serving)."""
        adaptive, self.adaptive = self.adaptive, False
        try:
            yield
        finally:
            self.adaptive = adaptive

    def _t(self, batch: int) -> _Track:
        return self._track.setdefault(batch, _Track())

    def tree(self, batch: int) -> TreeConfig | None:
        """The tree to use now at this batch size, or None for plain decoding."""
        ladder, t = self.ladder(batch), self._t(batch)
        while self.adaptive and t.rung < len(ladder) and t.accept_bound is not None:
            cost = self.iteration_s.get((batch, ladder[t.rung]))
            if cost is None or not self.agree(t.accept_bound * self.plain_step_s[batch] / cost < 1):
                break
            self._step_down(batch, f"could reach {t.accept_bound * self.plain_step_s[batch] / cost:.2f}x at most "
                                   f"(accept length {t.accept_bound:.2f} or less, one iteration "
                                   f"{cost / self.plain_step_s[batch]:.2f} plain steps)")
        return ladder[t.rung] if t.rung < len(ladder) else None

    def start_call(self, batch: int) -> None:
        """A generate call begins: count it, and try speculation again after a long fallback."""
        self._t(batch).calls += 1
        self.retry(batch)

    def retry(self, batch: int) -> None:
        """After ``RETRY_PLAIN_STEPS`` plain steps since falling back, start again from the top of the ladder with
        fresh evidence. Every rank counts the same steps, so all decide alike without a collective."""
        t = self._t(batch)
        if self.adaptive and t.rung >= len(self.ladder(batch)) and t.plain_steps >= RETRY_PLAIN_STEPS:
            self._track[batch] = _Track(calls=1)
            self.log(f"batch {batch}: trying speculation again after {t.plain_steps} plain steps")

    def observe(self, batch: int, tokens: int, active: int, seconds: float | None = None) -> None:
        """Book one speculative iteration: tokens emitted by the ``active`` rows in ``seconds`` of wall time
        (None: the measured iteration's cost)."""
        if not self.adaptive or active == 0:
            return
        t = self._t(batch)
        if seconds is None:
            seconds = self.iteration_s[(batch, self.ladder(batch)[t.rung])]
        t.window.append((tokens, active, seconds))
        t.iters += 1
        n = len(t.window)
        if n < WINDOW or t.iters % WINDOW or (t.calls < 2 and n < LONG_WINDOW):
            return
        accept = sum(k for k, _, _ in t.window) / sum(a for _, a, _ in t.window)
        spent = sum(s for _, _, s in t.window)
        # Plain decoding emits one token per active row and step: an iteration's k tokens over its a rows
        # would have taken k / a plain steps.
        speed = self.plain_step_s[batch] * sum(k / a for k, a, _ in t.window) / spent
        if self.agree(speed < 1):
            t.accept_bound = accept
            self._step_down(batch, f"ran at {speed:.2f}x plain decoding (accept length {accept:.2f} over the last "
                                   f"{n} iterations, one iteration took {spent / n / self.plain_step_s[batch]:.2f} "
                                   "plain steps)")

    def observe_plain(self, batch: int) -> None:
        self._t(batch).plain_steps += 1

    def _step_down(self, batch: int, why: str) -> None:
        ladder, t = self._ladders[batch], self._track[batch]
        was = ladder[t.rung].describe()
        t.rung += 1
        unbuilt = []
        while t.rung < len(ladder) and not self.ready(batch, ladder[t.rung]):
            unbuilt.append(ladder[t.rung].describe())
            t.rung += 1
        t.window.clear()
        t.iters, t.calls = 0, 1
        nxt = ladder[t.rung].describe() if t.rung < len(ladder) else "plain decoding"
        skip = f" (not built, so skipped: {'; '.join(unbuilt)})" if unbuilt else ""
        self.log(f"batch {batch}: tree {was} {why}; switching to {nxt}{skip}")
