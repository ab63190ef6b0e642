"""Ctrl-C and SIGTERM end a long job cleanly: the unit in progress finishes, what is done is saved.

``train``, ``data regenerate`` and ``data capture`` run their loops inside
``stop_on_signal``. The first SIGINT or SIGTERM only sets a flag, which the loop reads
between units (a training step, a decoding step, a feature shard); the loop then
saves its progress and raises ``Interrupted``, whose sentence says what was kept and
how to resume, and the CLI exits with status 130. A second Ctrl-C stops at once
(KeyboardInterrupt): every save is atomic or append-only, so what was saved before stays
valid and the rerun resumes from it.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from eaglet.errors import Interrupted

# Interrupted is defined in errors.py (the rank launcher raises it too) and belongs to this API.
__all__ = ["Interrupted", "StopFlag", "stop_on_signal", "ignoring_stop_signals"]


class StopFlag:
    def __init__(self) -> None:
        self.signal: str | None = None  # the name of the signal that asked to stop

    def __bool__(self) -> bool:
        return self.signal is not None


@contextmanager
def stop_on_signal(unit: str) -> Iterator[StopFlag]:
    """Within the block, SIGINT/SIGTERM set the yielded flag instead of killing the job; ``unit`` names
    what finishes first ("training step", "batch", "shard"). Outside the main thread (where Python
    cannot take signals) the flag simply never rises."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, _frame) -> None:
        if flag:
            raise KeyboardInterrupt
        flag.signal = signal.Signals(signum).name
        print(f"eaglet: {flag.signal}: stopping after this {unit} and saving the progress "
              "(Ctrl-C again stops at once)", file=sys.stderr, flush=True)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def ignoring_stop_signals() -> Iterator[None]:
    """SIGINT and SIGTERM do nothing within the block: for the ranks that follow rank 0, which
    alone decides when the ranks stop (under torchrun every rank gets the signal)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
