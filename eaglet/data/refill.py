"""Regeneration on the local target: one running batch whose finished rows are refilled at once.

A batch decoded to its end runs until its longest answer ends, while answers run from a few
tokens to ``max_new_tokens``: most rows idle. Here a ``Session`` keeps ``rows`` rows busy: after
every step the finished rows are released (their answers handed on); once a sixteenth of the rows
is free (or none runs) the next prompts are prefilled into every free row in one forward, wherever
the rows lie (``Session.admit``), so a step's few finished rows do not each cost a prefill. One session
serves the whole run, so its step is compiled and captured once (on CUDA; on CPU the plain step).

Each answer draws from its own generator (``Draws``: the run's seed and the answer's id), so a
sampled answer does not depend on the row or the company it lands in; a resumed run writes the
answers an uninterrupted one would have, up to floating-point rounding: a row's logits can move
in the last bits with the rows beside it (padding, kernel choice), which in a near-tie changes
a token. Greedy answers are the target's greedy output (``PlainGenerator.generate``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from eaglet.data.prompts import Conversation
from eaglet.errors import EagletError
from eaglet.generate import PlainGenerator
from eaglet.loading.target import Target
from eaglet.sampling import SamplingParams
from eaglet.session import Draws, Session, bucket_size

CAPACITY_STEP = 256  # the KV capacity is rounded up to this
ADMIT_WAIT = 16  # admit once batch/ADMIT_WAIT rows are free (or none runs): fewer, larger prefills
PREFILL_TOKENS = 131072  # an admission of long prompts is split until its padded prefill fits this


@dataclass(frozen=True)
class Job:
    """One answer to write: the conversation (its id is the answer's id), its templated prompt, its setting."""

    conv: Conversation
    prompt: list[int]
    temperature: float  # 0 = greedy
    seed: int  # the answer's own draws


@dataclass(frozen=True)
class Answer:
    job: Job
    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    answer_ids: list[int] | None  # the target's own token ids; None when a server answered


def capacity(target: Target, longest: int, max_new_tokens: int) -> int:
    """KV slots for ``longest`` prompt tokens plus the answer, rounded up to CAPACITY_STEP and capped at the
    window (an answer to a prompt near the window's end is cut there; none fits when this is <= longest)."""
    return min(target.config.context_window, -(-(longest + max_new_tokens + 1) // CAPACITY_STEP) * CAPACITY_STEP)


def answer_locally(target: Target, jobs: list[Job], params: SamplingParams, rows: int,
                   admitting: Callable[[], bool], done: Callable[[list[Answer]], None]) -> None:
    """Answer ``jobs`` in order with a batch of ``rows`` rows refilled as rows finish.

    ``admitting()`` is asked before each admission while jobs wait; once False, no job is admitted
    again and the rows in flight finish. ``done(answers)`` receives the answers finished by each
    admission or step (often none): it may raise to stop the run (Ctrl-C), dropping the rows in flight.
    """
    if not jobs:
        return
    longest = max(len(j.prompt) for j in jobs)
    cap = capacity(target, longest, params.max_new_tokens)
    if cap <= longest:
        raise EagletError(f"a prompt of {longest} tokens leaves no room in the model's {cap}-token window; "
                          "lower --max-prompt-tokens")
    gen = PlainGenerator(target, cap)
    session = gen.session(bucket_size(min(rows, len(jobs)), gen.use_graphs), params, own_draws=True)
    queue, owner = deque(jobs), {}
    min_free = max(1, session.batch // ADMIT_WAIT)
    with torch.inference_mode():
        while True:
            free = len(session.free_rows())
            if queue and free and (free >= min(min_free, len(queue)) or not session.running()):
                if admitting():
                    _admit(session, queue, owner, params)
                else:
                    queue.clear()  # the budget ended: the rows in flight finish, nothing joins them
            done([_answer(target, owner.pop(i), session.release(i)) for i in list(owner) if session.rows[i].done])
            if not session.running():
                if not queue:
                    return
                continue
            session.step()


def _admit(session: Session, queue: deque, owner: dict[int, Job], params: SamplingParams) -> None:
    """Prefill waiting jobs into every free row, in one forward (split while the padded prefill exceeds
    PREFILL_TOKENS)."""
    free = session.free_rows()
    while free and queue:
        n = min(len(free), len(queue))
        while n > 1 and n * max(len(queue[i].prompt) for i in range(n)) > PREFILL_TOKENS:
            n //= 2
        take, rows, free = [queue.popleft() for _ in range(n)], free[:n], free[n:]
        session.admit(rows, [j.prompt for j in take], params, [Draws(j.seed, j.temperature) for j in take])
        owner.update(zip(rows, take))


def _answer(target: Target, job: Job, out) -> Answer:
    return Answer(job, target.tokenizer.decode(out.tokens, skip_special_tokens=True), out.finish_reason,
                  len(job.prompt), len(out.tokens), out.tokens)
