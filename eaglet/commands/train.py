"""``eaglet train``: regenerate (optionally), train, validate and export a draft; also under
torchrun (data parallel) and at ``--tp N`` (the target sharded, the draft on rank 0)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from eaglet.commands.common import lead, load, prepare, shard, tp_job
from eaglet.errors import EagletError
from eaglet.parallel.launch import is_main_process, run_tp
from eaglet.parallel.state import TPGroup
from eaglet.train.budget import CLOCK_NAME, Clock, spent
from eaglet.train_options import TrainOptions


def run(opts: TrainOptions) -> int:
    if not opts.time_budget_min:
        return _run(opts, Clock())
    # A budgeted run cut into pieces (Ctrl-C, a job's time limit) gets what the budget has left on rerun,
    # and reports the wall time of all its pieces.
    with spent(Path(opts.out) / CLOCK_NAME, keep=is_main_process()) as clock:
        return _run(opts, clock)


def _run(opts: TrainOptions, clock: Clock) -> int:
    """--time-budget-min counts from ``clock``'s start (loading the target included; earlier pieces too)."""
    from eaglet.train.dist import init_distributed

    if tp_job(opts.tp, under_torchrun_too=False):  # torchrun without --tp: data parallel (DDP)
        if opts.regen is not None:
            raise EagletError(f"--regenerate does not run with --tp {opts.tp} yet; regenerate the answers with "
                              "`eaglet data regenerate` and pass that file as --data")
        prepare(opts.target, opts.tp)
        result = run_tp(opts.tp, train_rank, opts, clock.start, device=opts.target.device, sigterm_to_rank0=True)
        main = is_main_process()
    else:
        dist = init_distributed(opts.target.device)
        regen_budget = 60 * opts.regen_budget_min if opts.regen_budget_min else None
        with clock.stage("load"):
            target = load(opts.target, dist.device)
        result = _train(target, opts, dist, clock, opts.regen, regen_budget, opts.train_tokens_per_s)
        result.update(clock.summary())  # every piece of the job: wall time, and per stage
        main = dist.main
    if main:
        result.pop("config")
        print(json.dumps({"draft": str(Path(opts.out) / "draft"), **result}))
    return 0


def train_rank(tp: TPGroup, opts: TrainOptions, start: float) -> dict[str, Any] | None:
    """``start``: the job's (``Clock.start`` in the launching process)."""
    from eaglet.parallel.launch import rank_device
    from eaglet.train.dist import DistInfo

    # One trainer (world 1): the ranks shard the target, not the data.
    dist = DistInfo(device=rank_device(opts.target.device))
    clock = Clock(before=time.time() - start)  # starting where the job did
    result = lead(tp, shard(tp, opts.target), lambda target: _train(target, opts, dist, clock))
    if result is not None:
        result["tp"] = tp.size
    return result


def _train(target, opts: TrainOptions, dist, clock: Clock, regen=None, regen_budget_s: float | None = None,
           train_tokens_per_s: float | None = None) -> dict:
    from eaglet.train.pipeline import run_train

    budget = 60 * opts.time_budget_min if opts.time_budget_min else None
    return run_train(target, opts.data, Path(opts.out), opts.train, dist, regen, opts.features, opts.val_features,
                     opts.val_fraction, budget, regen_budget_s, train_tokens_per_s, clock)
