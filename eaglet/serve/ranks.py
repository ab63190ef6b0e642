"""``eaglet serve --tp N``: rank 0 serves HTTP; the other ranks repeat its engine calls on their shards.

The scheduler (scheduler.py) is single-process code: it decides on rank 0 when a batch
opens, which prompt joins which row, when the batch steps and when a row is freed. Under
tensor parallelism it drives a ``LeadingEngine``, which sends each of those calls as an
order to the other ranks (over a ``ControlChannel``) before making it; the followers
make the same call on their shard, so the collectives inside the sharded target pair up.
Inside a call the engine already keeps the ranks in step (rank 0's sampled tokens,
trees and accepted paths are broadcast), so every rank's session holds the same rows.

Failures: a call that raises on rank 0 raises on the followers too when its cause is in
the inputs (a prompt too long for the cache, say); the follower drops the batch as the
scheduler does and waits for the next order. A failure on one rank only leaves the
others in a collective until its timeout, and the launcher then names that rank.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from eaglet.parallel.control import ControlChannel

OPEN, GROW, ADMIT, STEP, RELEASE, STOP = "open", "grow", "admit", "step", "release", "stop"


class LeadingSession:
    """Rank 0's session: ``admit``, ``step`` and ``release`` are announced; the rest is the local session's."""

    def __init__(self, session, channel: ControlChannel):
        self._session, self._channel = session, channel

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def admit(self, rows, prompts: list[list[int]], params) -> list[list[int]]:
        self._channel.send((ADMIT, rows, prompts, params))
        return self._session.admit(rows, prompts, params)

    def step(self, launched=None) -> dict[int, list[int]]:
        self._channel.send((STEP,))
        return self._session.step(launched)

    def release(self, row: int):
        self._channel.send((RELEASE, row))
        return self._session.release(row)


class LeadingEngine:
    """Rank 0's engine for the scheduler: opening a batch is announced, its session leads."""

    def __init__(self, engine, channel: ControlChannel):
        self._engine, self._channel = engine, channel

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def session(self, batch: int, params) -> LeadingSession:
        self._channel.send((OPEN, batch, params))
        return LeadingSession(self._engine.session(batch, params), self._channel)

    def grow(self, small: LeadingSession, batch: int) -> LeadingSession:
        """``small``'s rows in a session of ``batch`` rows, announced once grown here (a growth that fails on
        rank 0 leaves every rank with the small batch)."""
        big = self._engine.grow(small._session, batch)
        self._channel.send((GROW, batch))
        return LeadingSession(big, self._channel)

    def stop(self) -> None:
        """Let the followers return (the server has stopped)."""
        self._channel.send((STOP,))


@torch.inference_mode()
def follow(engine, channel: ControlChannel) -> int:
    """The other ranks: make rank 0's calls until it stops; returns how many orders were carried out."""
    session, orders = None, 0
    while True:
        order = channel.receive()
        op, args = order[0], order[1:]
        if op == STOP:
            return orders
        orders += 1
        try:
            if op == OPEN:
                session = engine.session(*args)
            elif session is None:
                continue  # the batch failed here as on rank 0, which opens a new one before using it
            elif op == GROW:
                session = engine.grow(session, *args)
            elif op == ADMIT:
                session.admit(*args)
            elif op == STEP:
                session.step()
            elif op == RELEASE and args[0] in session.rows:
                session.release(*args)
        except Exception as e:  # noqa: BLE001  (rank 0 met the same failure and goes on; so do we)
            print(f"eaglet: rank {channel.tp.rank}: {op} failed as on rank 0 ({e!r}); waiting for the next order",
                  file=sys.stderr)
            if op in (OPEN, GROW, STEP):
                session = None
