"""The attention kernel alone, split across programs or not: microseconds a call, by shape.

    PYTHONPATH=. python scripts/attention_micro.py --splits 1 2 4 8

Each (shape, committed length, splits) is captured in a CUDA graph of 20 calls and replayed (CUDA events,
median of 5 replays after a warm-up), so launch gaps are those of a captured step. Shapes are SmolLM2's
heads (9 query, 3 KV, head dim 64) and Llama-3.1-8B's (32, 8, 128): a decode token at batches 1, 4 and
16, and a 48-node verify at batch 1. Nothing compiles: a run takes seconds. The table it prints is what
``tree_attention.split_count`` should follow.
"""

from __future__ import annotations

import argparse

import torch

from eaglet.models.tree_attention import launch

HEADS = {"smollm2": (9, 3, 64), "llama3-8b": (32, 8, 128)}
CASES = [(1, 1), (4, 1), (16, 1), (1, 48)]  # (batch, query tokens)


def graph_us(fn, calls: int = 20) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--lens", type=int, nargs="+", default=[300, 1000, 3000])
    ap.add_argument("--heads", nargs="+", default=list(HEADS))
    a = ap.parse_args()
    print(f"{'heads':>10} {'batch':>5} {'tokens':>6} {'lens':>5} " + " ".join(f"{f'split {s}':>9}" for s in a.splits)
          + "  (us a call)")
    for name in a.heads:
        nq, nkv, d = HEADS[name]
        for b, t in CASES:
            for lens in a.lens:
                q = torch.randn(b, t, nq, d, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(b, nkv, 4096 + 64, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                n = torch.full((b,), lens, device="cuda")
                extra = torch.ones(b, t, t, dtype=torch.bool, device="cuda").tril()
                ref = launch(q, k, v, n, extra, 1)
                row = []
                for s in a.splits:
                    out = launch(q, k, v, n, extra, s)
                    assert (out.float() - ref.float()).abs().max().item() < 2e-2, f"splits={s} differs"
                    row.append(graph_us(lambda x=(q, k, v, n, extra, s): launch(*x)))
                print(f"{name:>10} {b:>5} {t:>6} {lens:>5} " + " ".join(f"{x:9.2f}" for x in row), flush=True)


if __name__ == "__main__":
    main()
