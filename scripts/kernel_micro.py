"""The attention kernel alone, in microseconds a call by shape, with its committed slots split across
1, 2, 4 and 8 programs: the table that ``tree_attention.auto_splits`` follows.

    PYTHONPATH=. python scripts/kernel_micro.py --splits 1 2 4 8

Each call is captured in a CUDA graph of 20 calls and replayed (CUDA events, mean of 5 replays after 3
warm-up replays), so launch gaps are those of a captured step. Attention: SmolLM2's heads (9 query, 3 KV, head
dim 64) and Llama-3.1-8B's (32, 8, 128), a decode token at batches 1, 4 and 16 and a 48-node verify at
batch 1. Nothing compiles: a run takes seconds. (A Triton kernel for GEMMs of at most 8 rows was timed
here against cuBLAS in session 16 and lost at every shape: docs/performance.md.)
"""

from __future__ import annotations

import argparse

import torch

from eaglet.cuda_graph import GraphedStep
from eaglet.models.tree_attention import launch
from scripts.spec_step_costs import cuda_ms

HEADS = {"smollm2": (9, 3, 64), "llama3-8b": (32, 8, 128)}
CASES = [(1, 1), (4, 1), (16, 1), (1, 48)]  # (batch, query tokens)


def graph_us(fn, calls: int = 20) -> float:
    """Microseconds a call of ``fn``: ``calls`` calls captured in one graph (GraphedStep), replayed."""
    step = GraphedStep(lambda: [fn() for _ in range(calls)][-1])
    return cuda_ms(step, reps=5) * 1e3 / calls


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
