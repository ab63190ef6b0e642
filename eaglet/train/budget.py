"""How ``eaglet train --regenerate --time-budget-min M`` splits its minutes.

Regeneration runs first and keeps adding answers while the time left can still train
``epochs`` passes over everything answered so far:

    stop regenerating when  elapsed + reserve + train_seconds(tokens)  >=  budget
    train_seconds(tokens) = padding * tokens * (1 / train_tokens_per_s + (epochs - 1) / cached_tokens_per_s)

``tokens`` are the prompt and answer tokens of the records written so far (earlier runs
included); ``padding`` (1.08) is padded over real tokens of length-bucketed batches and
``train_tokens_per_s`` the padded tokens training gets through per second, validation every
250 steps and checkpoints included: a single-process run times a few steps of its own before it
regenerates (``probe``), ``--train-tokens-per-s`` sets it, and the figure below stands in for runs
across ranks. Both constants were measured in the one-command runs that made SmolLM2 drafts on one
H200 (session 9's: 107k/s with a draft vocabulary of 12,288; session 13's, shipped: 6 passes over
10.0M tokens in 661 s, 3,714 steps at 0.178 s with the vocabulary of 24,576: 98k/s). Passes after the first
read the target's features from memory where the run keeps them (``feature_cache``): the probe times those
steps too (``cached_tokens_per_s``; the first pass's rate where it is not timed). ``reserve`` covers
tokenizing (2.5 s a million tokens; 1.4-1.7 s measured on the H200's host), the final validation and the
export (20 s) and 2% of the budget for error. Until session 23 it was 60 s + 5% of the budget, which left
62 of a 7.5-minute run's 450 s unused (tokenizing took 8 s, the training estimate was within 3%). Training
then gets whatever is left and stops in time to validate and export (the trainer keeps its own margin for
that); if the estimate was optimistic, the learning rate has still decayed by the clock (``trainer.lr_at``).

When regeneration stopped on the budget, ``OUT/regenerated.done.json`` says so: a rerun
of the same command (after an interruption) trains on the same data instead of
regenerating more, so a run cut into pieces trains on what the uncut run would have.
``OUT/clock.json`` (``spent``) holds the seconds the earlier pieces ran: a rerun gets what
the budget has left, not the whole budget again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from eaglet.outputs import write_atomic

PADDING = 1.08  # padded / real training tokens, length-bucketed batches (shipped SmolLM2 run)
H200_SMOLLM2_TRAIN_TOKENS_PER_S = 98_000.0  # padded tokens per second, 7 TTT steps, bf16 (shipped run)
DONE_NAME = "regenerated.done.json"
CLOCK_NAME = "clock.json"  # seconds the earlier pieces of a budgeted run spent, in all and per stage (``spent``)


@dataclass(frozen=True)
class BudgetSplit:
    budget_s: float  # the whole command, from its start
    epochs: int
    train_tokens_per_s: float = H200_SMOLLM2_TRAIN_TOKENS_PER_S  # the first pass (the target computes features)
    regen_budget_s: float | None = None  # an explicit cap on regeneration (--regen-budget-min)
    cached_tokens_per_s: float | None = None  # later passes, features read from memory; None: as the first

    def reserve_s(self, tokens: int) -> float:
        """Seconds kept for what follows regeneration besides training, with ``tokens`` data tokens."""
        return 20.0 + 2.5e-6 * tokens + 0.02 * self.budget_s

    def train_seconds(self, tokens: int) -> float:
        """Estimated seconds of ``epochs`` passes over ``tokens`` data tokens."""
        later = self.cached_tokens_per_s or self.train_tokens_per_s
        return PADDING * tokens * (1 / self.train_tokens_per_s + (self.epochs - 1) / later)

    def regen_should_stop(self, elapsed_s: float, tokens: int) -> bool:
        if self.regen_budget_s is not None:
            return elapsed_s >= self.regen_budget_s
        return elapsed_s + self.reserve_s(tokens) + self.train_seconds(tokens) >= self.budget_s

    def stopper(self, start: float) -> Callable[[int], bool]:
        """``stop_when(tokens)`` for ``regenerate``, counting from ``start`` (a ``time.time()``)."""
        return lambda tokens: self.regen_should_stop(time.time() - start, tokens)


def mark_done(out: Path, info: dict) -> None:
    write_atomic(out / DONE_NAME, json.dumps(info, indent=1))


def regen_done(out: Path) -> dict | None:
    """What an earlier run recorded when the budget ended its regeneration, or None."""
    try:
        return json.loads((out / DONE_NAME).read_text())
    except (OSError, ValueError):
        return None


class Clock:
    """The wall time of a job that may run in pieces: ``before`` = what earlier pieces spent, ``stages`` =
    seconds per named stage over every piece (loading, regeneration, tokenizing, training)."""

    def __init__(self, before: float = 0.0, stages: dict[str, float] | None = None):
        self.before, self.stages, self.t0 = before, dict(stages or {}), time.time()

    @property
    def start(self) -> float:
        """When the job would have started had its pieces run without a break (a ``time.time()``)."""
        return self.t0 - self.before

    def total(self) -> float:
        return time.time() - self.start

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Adds the block's seconds to ``stages[name]``, however the block ends."""
        t = time.time()
        try:
            yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + time.time() - t

    def summary(self) -> dict:
        return {"wall_s": round(self.total(), 1), "stages_s": {k: round(v, 1) for k, v in self.stages.items()}}


@contextmanager
def spent(path: Path, keep: bool = True) -> Iterator[Clock]:
    """Yields the job's ``Clock``, holding what earlier (interrupted) runs spent on it, in all and per stage;
    adds this run's, however it ends, where its directory exists (a run refused before it made one leaves
    nothing behind). ``keep=False`` only reads (ranks other than the one that writes)."""
    recorded = json.loads(path.read_text()) if path.is_file() else {}
    clock = Clock(recorded.get("seconds", 0.0), recorded.get("stages"))
    try:
        yield clock
    finally:
        if keep and path.parent.is_dir():
            write_atomic(path, json.dumps({"seconds": clock.total(), "stages": clock.stages}))
