"""``eaglet bench``: every method on the same prompts (bench/run.py), or a running server (bench/endpoint.py)."""

from __future__ import annotations

import dataclasses

from eaglet.commands.common import note, prepare, shard, tp_job
from eaglet.errors import EagletError
from eaglet.options import BENCH_METHODS, BenchConfig, EndpointBenchConfig
from eaglet.parallel.launch import run_tp
from eaglet.parallel.state import TPGroup


def run(opts: BenchConfig | EndpointBenchConfig) -> int:
    if isinstance(opts, EndpointBenchConfig):
        from eaglet.bench.endpoint import run_endpoint_bench

        report = run_endpoint_bench(opts)
        return 1 if report["summary"]["failed"] else 0
    if tp_job(opts.tp):
        opts = _sharded_methods(opts)
        prepare(opts.target, opts.tp)
        run_tp(opts.tp, bench_rank, opts, device=opts.target.device)
        return 0
    from eaglet.bench.run import run_bench

    run_bench(opts)
    return 0


def _sharded_methods(opts: BenchConfig) -> BenchConfig:
    """transformers' methods do not shard: left out when --methods was not given, refused when it names them."""
    theirs = [m for m in opts.methods if m.startswith("hf")]
    if theirs and opts.methods != BENCH_METHODS:
        raise EagletError(f"--tp {opts.tp} runs eaglet's own methods only (plain, spec): transformers' generate "
                          f"does not shard; leave {','.join(theirs)} out of --methods")
    if theirs:
        opts = dataclasses.replace(opts, methods=tuple(m for m in opts.methods if m not in theirs))
        note(f"at --tp {opts.tp} the bench runs {','.join(opts.methods)} (transformers' methods do not shard)")
    return opts


def bench_rank(tp: TPGroup, opts: BenchConfig) -> None:
    from eaglet.bench.run import run_bench

    run_bench(opts, shard(tp, opts.target))  # rank 0 prints and writes the report
