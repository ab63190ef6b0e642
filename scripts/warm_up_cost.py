"""Where a cold server's warm-up goes: each prefill graph of the target and the draft, timed.

    PYTHONPATH=. python scripts/warm_up_cost.py --device cuda [--compile-prefill]   # H200: a table, a profile
    PYTHONPATH=. python scripts/warm_up_cost.py --device cpu --max-length 32 --rows 2   # smoke test
    PYTHONPATH=. python scripts/warm_up_cost.py --device cuda --compile-prefill --rows 2 --cache DIR  # cold, then warm

On a fresh H200 `eaglet serve` printed "prefills ready (108.0 s)" before its batch-1 step compiled, and
`bench` spent 33-94 s a method on its shape pass: each new (rows, length) prefill graph is built on first
use. This runs the server's prefill warm-up (`serve.server.warm_prefills`: the graph of every length and
every power of two of rows up to ``--rows``, target then draft, then eager prefills at the Triton kernel's
lengths) with random SmolLM2-shaped weights and a random draft, in a process whose Triton and inductor
caches start empty, timing every graph and counting the Triton and inductor cache files written and the graphs
dynamo compiled for it (``TORCH_LOGS=recompiles`` prints why each recompile happened); then the
costliest functions of the whole warm-up by cumulative and by own time (cProfile). ``--compile-prefill`` fuses
each bucket first, as `bench` and `serve` do by default on CUDA. A fresh H100's servers took ~335 s to warm 78
target graphs whether torch's caches were warm or not (docs/performance.md, session 42): ``--cache`` run twice
tells what a later process still pays.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--draft-vocab", type=int, default=24576)
    ap.add_argument("--max-length", type=int, default=4096, help="the engine's context (longest bucket)")
    ap.add_argument("--rows", type=int, default=64, help="the server's largest batch: graphs of every power of two")
    ap.add_argument("--compile-prefill", action="store_true",
                    help="fuse each bucket with torch.compile before capture (bench's and serve's default on CUDA)")
    ap.add_argument("--top", type=int, default=25, help="functions of the profile to print")
    ap.add_argument("--lengths", default=None, metavar="L1,L2,...",
                    help="the prefill buckets' lengths instead of prefill.LENGTHS (an experiment: fewer distinct "
                         "lengths, fewer new shapes to warm, more padding)")
    ap.add_argument("--cache", help="torch's Triton and inductor caches here (default: a new empty folder); a "
                                    "second run with the same folder shows what a later process still pays")
    a = ap.parse_args()
    tmp = a.cache or tempfile.mkdtemp()
    os.environ["TRITON_CACHE_DIR"] = triton_dir = f"{tmp}/triton"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_dir = f"{tmp}/inductor"
    import cProfile
    import pstats

    import torch
    from torch._dynamo.utils import counters

    import eaglet.prefill
    from eaglet.serve.server import PREFILL_LENGTHS
    from eaglet.speculative import SpecEngine
    from scripts.bench_decode import random_draft, random_target

    if a.lengths:
        eaglet.prefill.LENGTHS = tuple(sorted(map(int, a.lengths.split(","))))  # read when the engine is built
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    target = random_target("smollm2-135m", dtype, a.device)
    eng = SpecEngine(target, random_draft(target, a.draft_vocab), a.max_length, adaptive=False, bucketed_prefill=True,
                     compile_prefill=a.compile_prefill, log=lambda _: None)

    def kernels() -> int:
        return sum(len(files) for _, _, files in os.walk(triton_dir))

    def inductor_files() -> int:  # compiled graphs, kernels' sources and their autotuning results (.best_config)
        return sum(len(files) for _, _, files in os.walk(inductor_dir))

    def compiles() -> int:  # graphs dynamo has compiled in this process (a recompile counts)
        return counters["stats"]["unique_graphs"]

    def row(what: str, s: float, k: int, c: int, i: int) -> str:
        return f"{what:<22}{s:>8.2f}{k:>7}{c:>9}{i:>9}"

    table = []  # (what, seconds, Triton cache files written, dynamo compiles, inductor cache files written)

    def timed(what: str, fn) -> None:
        k0, c0, i0 = kernels(), compiles(), inductor_files()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        table.append((what, time.perf_counter() - t0, kernels() - k0, compiles() - c0, inductor_files() - i0))
        print(row(*table[-1]), flush=True)  # as it happens: a run cut by a time limit still tells each graph's cost

    def captures() -> None:
        for name, graphs in (("target", eng.prefills), ("draft", eng.draft_prefills)):
            for rows in (1 << i for i in range(a.rows.bit_length())):  # as warm_prefills(engine, a.rows)
                for r, n in graphs.buckets(rows):
                    timed(f"{name} {r}x{n}", lambda g=graphs, r=r, n=n: g.capture(r, n))

    def eager() -> None:
        from eaglet.generate import prefill

        cache = target.model.new_cache(1, max(PREFILL_LENGTHS) + 1)
        for n in PREFILL_LENGTHS:
            cache.reset()
            timed(f"eager prefill {n}", lambda n=n: prefill(target, cache, [[0] * n]))

    print(f"{'what':<22}{'s':>8}{'files':>7}{'compiles':>9}{'inductor':>9}", flush=True)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    with torch.inference_mode():
        prof.runcall(captures)
        prof.runcall(eager)
        total = time.perf_counter() - t0
    for name in ("target", "draft", "eager"):
        mine = [r for r in table if r[0].startswith(name)]
        print(f"{name}: {len(mine)} prefills, {sum(r[1] for r in mine):.1f} s, {sum(r[2] for r in mine)} Triton files, "
              f"{sum(r[3] for r in mine)} compiles")
    print(f"warm-up in all: {total:.1f} s ({'caches from ' + a.cache if a.cache else 'cold'}); "
          "the costliest functions (cumulative):")
    stats = pstats.Stats(prof, stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(a.top)
    print("by own time (a C call that waits, e.g. on a kernel's selection or the allocator, shows here):")
    stats.sort_stats("tottime").print_stats(a.top)


if __name__ == "__main__":
    main()
