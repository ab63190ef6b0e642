"""What the commands share: loading the target, and under ``--tp N`` when to start ranks, the
checks before they start, each rank's shard of the target, and rank 0 leading a mirrored target.

Two ways to run N ranks (``parallel/`` starts them, or joins those torchrun started):

- generate, bench: every rank runs the whole decode loop. The decoders keep the ranks in
  step: rank 0's sampled tokens, draft trees, accepted paths and policy switches are
  broadcast (generate.py, speculative/engine.py), so each rank's target forward sees the
  same input and the ranks emit the same tokens.
- data capture, train: rank 0 runs the single-process code (batching, resume, time
  budgets, the draft's training) against a mirrored target, and the other ranks repeat
  its target calls on their shards (``parallel/mirror.py``). The draft exists on rank 0
  only: its optimiser steps need no synchronisation and nothing can drift.

Only rank 0 prints, streams and writes files.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from eaglet.options import TargetOptions
from eaglet.parallel.launch import is_main_process, under_torchrun
from eaglet.parallel.state import TPGroup


def note(msg: str) -> None:
    if is_main_process():
        print(f"eaglet: {msg}", file=sys.stderr)


def load(t: TargetOptions, device):
    """The whole target on ``device`` (this process's, which under torchrun is this rank's GPU)."""
    from eaglet.loading import load_target

    print(f"eaglet: loading {t.target} on {device} ({t.dtype})", file=sys.stderr)
    return load_target(t.target, dtype=t.torch_dtype, device=device)


def tp_job(tp: int, under_torchrun_too: bool = True) -> bool:
    """Run as N ranks: --tp > 1, or (generate, bench) any torchrun job, whose size must then match --tp."""
    return tp > 1 or (under_torchrun_too and under_torchrun())


def prepare(t: TargetOptions, tp: int) -> None:
    """Refuse a --tp this host or this target cannot run, in one sentence, before starting ranks."""
    from eaglet.loading.hf import read_config
    from eaglet.loading.target import check_shardable, resolve_target_dir
    from eaglet.parallel.launch import check_tp_size

    check_tp_size(tp, t.device)
    check_shardable(read_config(resolve_target_dir(t.target)), tp)  # converts a GGUF once, here
    note(f"loading {t.target} on {t.device} ({t.dtype}) at tp={tp}")


def shard(tp: TPGroup, t: TargetOptions):
    """This rank's shard of the target, read straight from the checkpoint."""
    from eaglet.loading.target import load_target
    from eaglet.parallel.launch import rank_device

    return load_target(t.target, dtype=t.torch_dtype, device=rank_device(t.device), tp=tp)


def lead(tp: TPGroup, target, fn: Callable[[Any], Any]) -> Any:
    """Rank 0 returns ``fn(target)`` run against a mirrored target; the other ranks repeat its
    target calls on their shards until it ends, and return None."""
    from eaglet.interrupt import ignoring_stop_signals
    from eaglet.parallel.mirror import follow, leading

    if tp.rank != 0:
        with ignoring_stop_signals():  # rank 0 saves and stops the followers when a signal comes
            follow(target.model, tp)
        return None
    with leading(target.model, tp) as leader:
        return fn(dataclasses.replace(target, model=leader))
