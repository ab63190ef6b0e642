"""``eaglet bench``: every method on the same prompts in one process, then the report.

Order: load the target (ours) and, when asked, transformers' copy and the draft; encode
the prompts with the chat template; for each method a short warm-up (graph capture,
allocator, lazy init) on the first batch, for eaglet's methods a pass of every batch
for two tokens (the kernels of each prefill shape: on an H200 a first use of some
prompt lengths cost 0.5-1 s each, which plain, run first, paid inside its timed run
and spec then found warm); then the timed runs, batch by batch with the methods in
turn, so that a drift of the machine's speed falls on every method alike. The
machine's load average is recorded before and after, since a shared CPU skews timings.

Under tensor parallelism (``eaglet bench --tp N``) every rank runs this with its shard
of the target; the ranks decode in lockstep and rank 0 alone logs, prints and writes
the report (its timings are the job's).
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from eaglet.bench.methods import HFRunner, Run, run_ours
from eaglet.bench.prompts import load_prompt_sets
from eaglet.bench.report import build_report, table, write_json, write_png
from eaglet.cuda_graph import COMPILES
from eaglet.errors import EagletError
from eaglet.options import BenchConfig, SamplingParams
from eaglet.speculative.load import int8_served

WARMUP_TOKENS = 16
SHAPE_PASS_TOKENS = 2  # the prefill and the first step (a speculative iteration) of every batch


def _log(msg: str) -> None:
    print(f"eaglet: {msg}", file=sys.stderr)


def _quiet(_msg: str) -> None:
    pass


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run_bench(cfg: BenchConfig, target=None) -> dict:
    """Run the bench; ``target`` may be passed in already loaded (tests, and each rank of ``--tp``)."""
    from eaglet.chat import encode_chat
    from eaglet.generate import PlainGenerator
    from eaglet.loading import load_target

    out = Path(cfg.out)
    params, t = cfg.sampling, cfg.target
    prompts = load_prompt_sets(cfg.prompts, cfg.limit)
    if target is None:
        _log(f"loading {t.target} on {t.device} ({t.dtype})")
        target = load_target(t.target, dtype=t.torch_dtype, device=t.device)
    tp = target.model.tp
    main = tp.rank == 0
    log_ = _log if main else _quiet
    if tp.size > 1 and {"hf", "hf-lookup"} & set(cfg.methods):
        raise EagletError(f"at tp={tp.size} only eaglet's own methods (plain, spec) run: transformers' generate "
                          "does not shard; leave hf and hf-lookup out of --methods")
    if main:
        out.mkdir(parents=True, exist_ok=True)
    for p in prompts:
        p.ids = encode_chat(target.tokenizer, p.messages)
    ids = [p.ids for p in prompts]

    decisions: list[str] = []
    generators, draft_path = {}, None
    fused_prefill = cfg.engine.fused_prefill(target.model.embed.weight.device)
    if "plain" in cfg.methods:
        generators["plain"] = PlainGenerator(target, t.max_context, compile_prefill=fused_prefill)
    if "spec" in cfg.methods:
        from eaglet.speculative.load import resolve_draft, spec_engine

        draft_path = resolve_draft(cfg.draft, target)
        if draft_path is None:
            raise EagletError(f"no draft ships for {t.target}; pass --draft DIR or leave spec out of --methods")

        def log(msg: str) -> None:
            decisions.append(msg)
            log_(msg)

        generators["spec"] = spec_engine(target, draft_path, t.max_context, cfg.engine, log)
    hf = HFRunner(target, t.torch_dtype, t.device) if {"hf", "hf-lookup"} & set(cfg.methods) else None

    # Each prompt set is batched on its own, so a batch's wall time belongs to one set and every set's
    # numbers are exact, not apportioned.
    spans = set_spans([p.set for p in prompts])
    batches = [(a, min(a + cfg.batch_size, hi)) for lo, hi in spans for a in range(lo, hi, cfg.batch_size)]

    def run(method: str, batch: list[list[int]], p: SamplingParams, start: int = 0) -> list[Run]:
        """``batch`` in batches of ``cfg.batch_size``; ``start``: the index of its first prompt."""
        if method in generators:
            return run_ours(generators[method], batch, p, cfg.batch_size, start)
        return hf.run(batch, p, cfg.batch_size, lookup=method == "hf-lookup", start=start)

    load_before = _load()
    warm = replace(params, max_new_tokens=min(WARMUP_TOKENS, params.max_new_tokens))
    shapes = replace(params, max_new_tokens=min(SHAPE_PASS_TOKENS, params.max_new_tokens))
    warm_up_s = {}  # first use of the batch size (compiling, capturing) and the shape pass, per method
    compiles_before = len(COMPILES)  # the compiles this run makes, each with its seconds (CUDA: the first uses)
    for m in cfg.methods:
        log_(f"{m}: warm-up")
        t0 = time.perf_counter()
        run(m, ids[: cfg.batch_size], warm)
        t1 = time.perf_counter()
        if m in generators:
            policy = getattr(generators[m], "policy", None)
            with policy.paused() if policy else contextlib.nullcontext():
                for lo, hi in spans:
                    run(m, ids[lo:hi], shapes, lo)
        warm_up_s[m] = {"first_batch": round(t1 - t0, 2), "shape_pass": round(time.perf_counter() - t1, 2)}
        log_(f"{m}: warm-up took {t1 - t0:.1f} s for its first batch, {warm_up_s[m]['shape_pass']:.1f} s "
             "for the shape pass")
    # Timed batch by batch, the methods in turn (who goes first rotates): a machine whose speed drifts
    # during the run (a shared CPU, clocks) then slows every method alike. Run one after the other, a
    # 2-core CPU's plain decoding ranged 30-39 tok/s over minutes and ratios moved by 0.1-0.3.
    log_(f"timed: {len(ids)} prompts in {len(batches)} batches, the methods in turn")
    runs: dict[str, list[Run]] = {m: [] for m in cfg.methods}
    for j, (lo, hi) in enumerate(tqdm(batches, desc="bench", unit="batch", disable=not main, dynamic_ncols=True)):
        for m in cfg.methods[j % len(cfg.methods):] + cfg.methods[: j % len(cfg.methods)]:
            runs[m] += run(m, ids[lo:hi], params, lo)
    for m, rs in runs.items():
        tokens, seconds = sum(len(r.tokens) for r in rs), sum({r.batch: r.seconds for r in rs}.values())
        log_(f"{m}: {tokens} tokens in {seconds:.1f} s ({tokens / seconds:.2f} tok/s)")

    texts = {m: [target.tokenizer.decode(r.tokens, skip_special_tokens=True) for r in rs] for m, rs in runs.items()}
    int8_head, int8_layer = int8_served(generators["spec"].draft) if "spec" in generators else (None, None)
    config = {
        "target": t.target, "target_path": str(target.path), "draft": str(draft_path) if draft_path else None,
        "prompts": cfg.prompts, "num_prompts": len(ids), "prompt_sets": dict(Counter(p.set for p in prompts)),
        "methods": list(cfg.methods),
        "max_new_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
        "top_k": params.top_k, "seed": params.seed, "batch_size": cfg.batch_size, "device": t.device, "tp": tp.size,
        "dtype": t.dtype, "tree_flags": list(cfg.engine.tree_flags), "spec_decisions": decisions,
        "compile_engine": cfg.engine.compile, "compile_prefill": fused_prefill,
        "policy": cfg.engine.policy,
        "draft_vocab": generators["spec"].draft.config.draft_vocab_size if "spec" in generators else None,
        "int8_draft_head": int8_head, "int8_draft_layer": int8_layer,
        "torch": torch.__version__, "transformers": _version("transformers"), "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "load_average_before": load_before, "load_average_after": _load(),
        "warm_up_s": warm_up_s,
        "compiles_s": [{"what": w, "seconds": sec} for w, sec in COMPILES[compiles_before:]],
        "gpu": torch.cuda.get_device_name() if torch.device(t.device).type == "cuda" else None,
        "hf_lookup_batch_size": 1 if "hf-lookup" in cfg.methods else None,
    }
    report = build_report(config, prompts, runs, params.greedy, texts)
    if not main:
        return report
    write_json(report, out)
    write_png(report, out)
    print(table(report))
    print(f"report: {out / 'report.json'}, {out / 'report.png'}")
    return report


def set_spans(sets: list[str | None]) -> list[tuple[int, int]]:
    """[start, end) of each run of equal set names (``load_prompt_sets`` keeps each set together)."""
    starts = [i for i in range(len(sets)) if i == 0 or sets[i] != sets[i - 1]]
    return list(zip(starts, starts[1:] + [len(sets)]))


def _version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None
