"""What a prompt's prefill costs, eager against captured per bucket (``eaglet/prefill.py``), and what a whole
prompt's fixed cost becomes: random weights of a model's shape, one row.

    PYTHONPATH=. python scripts/prefill_cost.py --device cuda          # H200: one table
    PYTHONPATH=. python scripts/prefill_cost.py --device cpu --lengths 20 --repeats 3   # smoke test

Per prompt length: the eager prefill into a cache (``generate.prefill``), the graphed one (replay plus
the copy into the batch's row), and ``PlainGenerator.generate`` of 1 and of 65 new tokens with each
prefill: generate(1) is the fixed cost (the prefill gives the first token; no step runs), and
(generate(65) - generate(1)) / 64 the cost a token (8 chunks of 8 steps under CUDA graphs).
Medians of ``--repeats`` runs after two warm-ups (which capture and compile). ``--compiled`` adds the
graphed prefill with its forward fused by torch.compile first (the engines' ``--compile-prefill``): its
replay, the seconds its first use at each length took (compile and capture), and ``PlainGenerator``'s
fixed cost and cost a token with it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default="smollm2-135m")
    ap.add_argument("--lengths", type=int, nargs="+", default=[20, 60, 100, 150, 250, 500])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--compiled", action="store_true", help="also the graphed prefill compiled first")
    a = ap.parse_args()

    from eaglet.generate import PlainGenerator, prefill, target_prefills
    from eaglet.kv_cache import Landing
    from eaglet.sampling import SamplingParams
    from scripts.bench_decode import random_target

    cuda = a.device == "cuda"
    target = random_target(a.shape, torch.bfloat16 if cuda else torch.float32, a.device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cache = target.model.new_cache(1, 4096)
    graphs = target_prefills(target, 4096, cuda, True)
    landing = Landing(cache, target.model.new_cache)
    gens = {mode: PlainGenerator(target, 4096, bucketed_prefill=mode == "graphed") for mode in ("eager", "graphed")}
    if a.compiled:
        gens["compiled"] = PlainGenerator(target, 4096, bucketed_prefill=True, compile_prefill=True)
    fused = gens["compiled"].prefills if a.compiled else None

    def median_ms(fn, *args) -> float:
        times = []
        for i in range(a.repeats + 2):
            sync()
            t0 = time.perf_counter()
            fn(*args)
            sync()
            if i >= 2:
                times.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(times)

    def eager(prompt):
        cache.reset()
        prefill(target, cache, [prompt])

    def graphed(prompt, bucketed=graphs):
        (logits,), view = bucketed.run([prompt])
        landing.land(view, [0], len(prompt))

    def first_use_s(prompt) -> float:
        sync()
        t0 = time.perf_counter()
        graphed(prompt, fused)
        sync()
        return time.perf_counter() - t0

    def measure(n: int) -> dict:
        prompt = [(7 * i) % 1000 + 3 for i in range(n)]
        row = {"length": n, "eager_ms": median_ms(eager, prompt),
               "graphed_ms": median_ms(graphed, prompt) if graphs.bucket(1, n) else None}
        if fused is not None and fused.bucket(1, n):
            row["compiled_first_use_s"] = first_use_s(prompt)
            row["compiled_ms"] = median_ms(graphed, prompt, fused)
        for mode, gen in gens.items():
            one = median_ms(gen.generate, [prompt], SamplingParams(max_new_tokens=1))
            many = median_ms(gen.generate, [prompt], SamplingParams(max_new_tokens=65))
            row[f"{mode}_token_ms"] = (many - one) / 64
            row[f"{mode}_fixed_ms"] = one
        print(row, file=sys.stderr, flush=True)
        return row

    with torch.inference_mode():
        rows = [measure(n) for n in a.lengths]
    cols = ["length", "eager_ms", "graphed_ms", *(["compiled_ms", "compiled_first_use_s"] * a.compiled),
            *(f"{mode}_fixed_ms" for mode in gens), *(f"{mode}_token_ms" for mode in gens)]
    print(f"\n{a.shape}, {a.device}, batch 1, medians of {a.repeats} (ms)")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join("-" if r.get(c) is None else f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c])
                         for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
