"""``eaglet generate | bench | data capture | train --tp N``: what each rank runs.

cli.py parses the arguments and hands them here. ``run_tp`` starts the N ranks (or,
under torchrun, joins the ranks torchrun started); each loads its shard of the target
straight from the checkpoint. Only rank 0 prints, streams and writes files.

- generate, bench: every rank runs the whole decode loop. The decoders keep the ranks
  in step: rank 0's sampled tokens, draft trees, accepted paths and policy switches are
  broadcast (generate.py, speculative/engine.py), so each rank's target forward sees the same
  input and the ranks emit the same tokens.
- data capture, train: rank 0 runs the single-process code (batching, resume, time
  budgets, the draft's training) against a mirrored target, and the other ranks
  repeat its target calls on their shards (mirror.py). The draft exists on rank 0
  only: its optimiser steps need no synchronisation and nothing can drift.

Before any rank starts, ``--tp`` is checked against the host and the target's shapes,
and a GGUF target is converted once.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from eaglet.errors import EagletError
from eaglet.loading.hf import read_config
from eaglet.loading.target import Target, load_target, resolve_target_dir
from eaglet.parallel.check import check_shardable
from eaglet.parallel.launch import check_tp_size, is_main_process, rank_device, run_tp
from eaglet.parallel.mirror import follow, leading
from eaglet.parallel.state import TPGroup


def _note(msg: str) -> None:
    if is_main_process():
        print(f"eaglet: {msg}", file=sys.stderr)


def check_before_ranks(args, device: str, dtype: torch.dtype) -> None:
    """Refuse a --tp this host or this target cannot run, in one sentence, before starting ranks."""
    check_tp_size(args.tp, device)
    check_shardable(read_config(resolve_target_dir(args.target)), args.tp)  # converts a GGUF once, here
    _note(f"loading {args.target} on {device} ({str(dtype).removeprefix('torch.')}) at tp={args.tp}")


def _shard(tp: TPGroup, target: str, device: str, dtype: torch.dtype) -> Target:
    return load_target(target, dtype=dtype, device=rank_device(device), tp=tp)


# --- generate ------------------------------------------------------------------------------------------------


def generate_tp(args, device: str, dtype: torch.dtype) -> int:
    check_before_ranks(args, device, dtype)
    result = run_tp(args.tp, generate_rank, args, device, dtype, device=device)
    if args.json and is_main_process():
        print(json.dumps(result))
    return 0


def generate_rank(tp: TPGroup, args, device: str, dtype: torch.dtype) -> dict:
    """``eaglet generate`` on one rank (tp=1 included): rank 0 streams, every rank returns the result."""
    from eaglet.chat import encode_chat
    from eaglet.generate import PlainGenerator
    from eaglet.sampling import SamplingParams
    from eaglet.speculative import SpecEngine
    from eaglet.speculative.load import load_engine_draft, resolve_draft

    main = tp.rank == 0
    target = _shard(tp, args.target, device, dtype)
    prompt = encode_chat(target.tokenizer, [{"role": "user", "content": args.prompt}])
    draft_path = resolve_draft(args.draft, target)
    if draft_path is None:
        if args.draft == "default" and main:
            print(f"eaglet: no default draft ships for {args.target}; plain decoding", file=sys.stderr)
        gen = PlainGenerator(target, args.max_context)
    streaming, held = False, []  # the engine's notes wait for the end of a streamed line

    def note(msg: str) -> None:
        if streaming:
            held.append(msg)
        else:
            print(f"eaglet: {msg}", file=sys.stderr)

    if draft_path is not None:
        if main:
            print(f"eaglet: draft {draft_path}", file=sys.stderr)
        gen = SpecEngine(target, load_engine_draft(draft_path, target), args.max_context, args.num_steps,
                         args.topk, args.num_draft_tokens, log=note, compile=args.compile,
                         adaptive=args.policy == "auto")
    params = SamplingParams(args.temperature, args.top_p, args.top_k, args.max_new_tokens, args.seed)
    on_token = None
    if main:
        from transformers import TextStreamer

        streamer = TextStreamer(target.tokenizer, skip_special_tokens=True)

        def on_token(_row: int, t: int) -> None:
            nonlocal streaming
            streaming = True
            streamer.put(torch.tensor([t]))

    [done] = gen.generate([prompt], params, on_token=on_token)
    if main:
        streamer.end()
        sys.stdout.flush()
        for msg in held:
            print(f"eaglet: {msg}", file=sys.stderr)
        if done.finish_reason == "length" and len(done.tokens) < args.max_new_tokens:
            from eaglet.generate import context_size

            print(f"eaglet: the answer stopped after {len(done.tokens)} of --max-new-tokens {args.max_new_tokens} "
                  f"tokens: prompt and answer filled the {context_size(target, args.max_context)}-token context; "
                  "raise --max-context for a longer answer", file=sys.stderr)
    accept = done.accept_lengths
    return {
        "text": target.tokenizer.decode(done.tokens, skip_special_tokens=True),
        "prompt_tokens": len(prompt),
        "completion_tokens": len(done.tokens),
        "finish_reason": done.finish_reason,
        "seconds": round(done.seconds, 4),
        "tokens_per_s": round(done.tokens_per_s, 2),
        "draft": str(draft_path) if draft_path else None,
        "accept_length": round(sum(accept) / len(accept), 3) if accept else None,
        "tp": tp.size,
    }


# --- bench ---------------------------------------------------------------------------------------------------


def bench_tp(args, cfg) -> int:
    """``cfg``: the BenchConfig cli.py built. transformers' methods do not shard: left out when --methods was
    not given, refused when it names them."""
    from eaglet.bench.methods import METHODS

    theirs = [m for m in cfg.methods if m.startswith("hf")]
    if theirs and args.methods != ",".join(METHODS):
        raise EagletError(f"--tp {args.tp} runs eaglet's own methods only (plain, spec): transformers' generate "
                          f"does not shard; leave {','.join(theirs)} out of --methods")
    if theirs:
        cfg = dataclasses.replace(cfg, methods=tuple(m for m in cfg.methods if m not in theirs))
        _note(f"at --tp {args.tp} the bench runs {','.join(cfg.methods)} (transformers' methods do not shard)")
    check_before_ranks(args, cfg.device, cfg.dtype)
    run_tp(args.tp, bench_rank, cfg, device=cfg.device)
    return 0


def bench_rank(tp: TPGroup, cfg) -> None:
    from eaglet.bench.run import run_bench

    run_bench(cfg, _shard(tp, cfg.target, cfg.device, cfg.dtype))  # rank 0 prints and writes the report


# --- data capture --------------------------------------------------------------------------------------------


def capture_tp(args, device: str, dtype: torch.dtype) -> int:
    check_before_ranks(args, device, dtype)
    result = run_tp(args.tp, capture_rank, args, device, dtype, device=device)
    if is_main_process():
        print(json.dumps(result))
    return 0


def capture_rank(tp: TPGroup, args, device: str, dtype: torch.dtype) -> dict | None:
    from eaglet.train.pipeline import capture_run

    target = _shard(tp, args.target, device, dtype)
    if tp.rank != 0:
        follow(target.model, tp)
        return None
    with leading(target.model, tp) as leader:
        target = dataclasses.replace(target, model=leader)
        split = None if args.split == "all" else args.split
        result = capture_run(target, args.data, split, Path(args.out), args.capture, args.max_len,
                             args.shard_samples, args.batch_tokens, getattr(torch, args.feature_dtype))
    return {**result, "tp": tp.size}


# --- train ---------------------------------------------------------------------------------------------------


def train_tp(args, cfg, regen, device: str, dtype: torch.dtype) -> int:
    """``cfg``, ``regen``: the TrainConfig and RegenConfig cli.py built."""
    start = time.time()  # --time-budget-min covers loading the target too
    if regen is not None:
        raise EagletError(f"--regenerate does not run with --tp {args.tp} yet; regenerate the answers with "
                          "`eaglet data regenerate` and pass that file as --data")
    check_before_ranks(args, device, dtype)
    result = run_tp(args.tp, train_rank, args, cfg, device, dtype, start, device=device)
    if is_main_process():
        result.pop("config")
        print(json.dumps({"draft": str(Path(args.out) / "draft"), **result}))
    return 0


def train_rank(tp: TPGroup, args, cfg, device: str, dtype: torch.dtype, start: float) -> dict[str, Any] | None:
    from eaglet.train.dist import DistInfo
    from eaglet.train.pipeline import run_train

    target = _shard(tp, args.target, device, dtype)
    if tp.rank != 0:
        follow(target.model, tp)
        return None
    budget = 60 * args.time_budget_min if args.time_budget_min else None
    with leading(target.model, tp) as leader:
        target = dataclasses.replace(target, model=leader)
        # One trainer (world 1): the ranks shard the target, not the data.
        result = run_train(target, args.data, Path(args.out), cfg, DistInfo(device=rank_device(device)), None,
                           args.features, args.val_features, args.val_fraction, budget, None, start)
    result["tp"] = tp.size
    return result
