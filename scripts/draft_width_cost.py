"""What a wider draft MLP (``train --draft-intermediate-size``) costs a speculative iteration.

    PYTHONPATH=. python scripts/draft_width_cost.py [--widths 1536,3072,6144] [--device cpu]

A random SmolLM2-shaped target and, per width, a random draft of that MLP width as served (bench_decode.random_draft;
float32 on the CPU), tree 5,2,8
(the CPU's default) with the policy off: milliseconds per generated token over a few prompts of random tokens,
the best of ``--rounds`` rounds (widths alternate within a round). A random draft's proposals are rarely accepted,
so a token is about one iteration: the figure is the iteration's cost, not a speed-up.
"""

from __future__ import annotations

import argparse
import time

import torch

from eaglet.options import SamplingParams
from eaglet.speculative import SpecEngine
from scripts.bench_decode import random_draft, random_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="1536,3072,6144")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    target = random_target("smollm2-135m", dtype, a.device)
    cfg = target.config
    prompts = [torch.randint(0, cfg.vocab_size, (100,)).tolist() for _ in range(a.prompts)]
    params = SamplingParams(max_new_tokens=a.tokens)
    best: dict[int, float] = {}
    for _ in range(a.rounds):
        for width in map(int, a.widths.split(",")):
            torch.manual_seed(1)
            eng = SpecEngine(target, random_draft(target, 24576, width), 512, num_steps=5, topk=2,
                             num_draft_tokens=8, adaptive=False, log=lambda _: None)
            with torch.inference_mode():
                eng.generate(prompts[:1], params)  # first use: the CPU's weight packing, CUDA's graphs
                t0, tokens = time.perf_counter(), 0
                for p in prompts:
                    tokens += len(eng.generate([p], params)[0].tokens)
                ms = (time.perf_counter() - t0) / tokens * 1e3
            best[width] = min(best.get(width, ms), ms)
            print(f"width {width}: {ms:.1f} ms a token", flush=True)
    base = best[min(best)]
    for width, ms in best.items():
        print(f"{width:>6} {ms:7.1f} ms  {ms / base - 1:+.0%}")


if __name__ == "__main__":
    main()
