"""``eaglet data regenerate`` (the target answers the prompts) and ``eaglet data capture``
(its hidden states as offline features, also at ``--tp N``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from eaglet.commands.common import lead, load, prepare, shard, tp_job
from eaglet.errors import EagletError
from eaglet.options import TargetOptions
from eaglet.parallel.launch import is_main_process, run_tp
from eaglet.parallel.state import TPGroup
from eaglet.train_options import REGEN_CONCURRENCY, CaptureOptions, RegenerateOptions


def _device(t: TargetOptions):
    """This process's device; `eaglet data` runs as one process, not under torchrun."""
    from eaglet.train.dist import init_distributed

    dist = init_distributed(t.device)
    if dist.enabled:
        raise EagletError("`eaglet data` runs as one process; under torchrun use `eaglet train --regenerate`")
    return dist.device


def _endpoint(opts: RegenerateOptions):
    """The server of ``data regenerate --endpoint``, with --target's tokenizer (no weights are read)."""
    from eaglet.data.remote import Endpoint
    from eaglet.loading.target import load_tokenizer, resolve_target_dir
    from eaglet.openai_client import api_base, served_model

    base = api_base(opts.endpoint)
    return Endpoint(base, served_model(base, opts.model), load_tokenizer(resolve_target_dir(opts.target.target)),
                    opts.concurrency or REGEN_CONCURRENCY)


def regenerate(opts: RegenerateOptions) -> int:
    from eaglet.data.prompts import load_conversations
    from eaglet.data.regenerate import claim_output, discard, regen_settings
    from eaglet.data.sources import answer_sources, side_file
    from eaglet.train.pipeline import sampled_prompts

    rc, out = opts.regen, Path(opts.out)
    convs = sampled_prompts(load_conversations(opts.data, opts.split), rc)
    endpoint = _endpoint(opts) if opts.endpoint else None
    # claimed before loading: a clash with an earlier run's settings fails fast
    claim_output(out, regen_settings(endpoint or opts.target.target, rc.params(), rc.answers), restart=opts.restart)
    if opts.restart:
        for kind in ("self-prompts", "follow-ups"):
            discard(side_file(out, kind))
    deadline = time.time() + 60 * opts.time_budget_min if opts.time_budget_min else None
    target = endpoint or load(opts.target, _device(opts.target))
    stats = answer_sources(target, convs, out, rc, (lambda _: time.time() >= deadline) if deadline else None,
                           claim_fix="pass another --out, or --restart to start over")
    print(json.dumps({"out": opts.out, **{k: sum(getattr(s, k) for s in stats)
                                          for k in ("done_before", "written", "too_long", "tokens")},
                      "stopped_early": any(s.stopped_early for s in stats),
                      "seconds": round(sum(s.seconds for s in stats), 1)}))
    return 0


def capture(opts: CaptureOptions) -> int:
    if tp_job(opts.tp, under_torchrun_too=False):
        prepare(opts.target, opts.tp)
        result = run_tp(opts.tp, capture_rank, opts, device=opts.target.device, sigterm_to_rank0=True)
    else:
        result = _capture(load(opts.target, _device(opts.target)), opts)
    if is_main_process():
        print(json.dumps(result))
    return 0


def capture_rank(tp: TPGroup, opts: CaptureOptions) -> dict | None:
    result = lead(tp, shard(tp, opts.target), lambda target: _capture(target, opts))
    return None if result is None else {**result, "tp": tp.size}


def _capture(target, opts: CaptureOptions) -> dict:
    from eaglet.options import torch_dtype
    from eaglet.train.pipeline import capture_run

    return capture_run(target, opts.data, opts.split, Path(opts.out), opts.capture, opts.max_len,
                       opts.shard_samples, opts.batch_tokens, torch_dtype(opts.feature_dtype))
