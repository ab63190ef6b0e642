"""Two kernel experiments alone, in microseconds a call by shape: the attention kernel split across programs
or not, and few-row GEMMs through small_matmul.py against cuBLAS (F.linear).

    PYTHONPATH=. python scripts/kernel_micro.py --splits 1 2 4 8

Each call is captured in a CUDA graph of 20 calls and replayed (CUDA events, mean of 5 replays after 3
warm-up replays), so launch gaps are those of a captured step. Attention: SmolLM2's heads (9 query, 3 KV, head
dim 64) and Llama-3.1-8B's (32, 8, 128), a decode token at batches 1, 4 and 16 and a 48-node verify at
batch 1. GEMMs: each linear of both shapes (qkv, o, gate_up, down, the LM head) at 1, 4 and 8 rows.
Nothing compiles: a run takes seconds. The tables say where the attention operator should split
and whether ``dense`` should take small_matmul by default.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from eaglet.cuda_graph import GraphedStep
from eaglet.models import small_matmul
from eaglet.models.tree_attention import launch
from scripts.spec_step_costs import cuda_ms

HEADS = {"smollm2": (9, 3, 64), "llama3-8b": (32, 8, 128)}
LINEARS = {  # (name, out features, in features) of each shape's linears, QKV and gate/up packed as served
    "smollm2": [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536),
                ("lm_head", 49152, 576), ("draft lm_head", 24576, 576)],
    "llama3-8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
                  ("lm_head", 128256, 4096), ("draft lm_head", 32000, 4096)],
}
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
    matmuls(a.heads)
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


def matmuls(shapes: list[str]) -> None:
    print(f"{'shape':>10} {'linear':>14} {'rows':>4} {'cuBLAS':>8} {'small_mm':>8} {'bn 8':>8} {'bn 16':>8}"
          "  (us a call)")
    for name in shapes:
        for linear, n, k in LINEARS[name]:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
            for rows in (1, 4, 8):
                x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
                ref = F.linear(x, w)
                assert (small_matmul.launch(x, w).float() - ref.float()).abs().max().item() < 5e-2
                times = [graph_us(lambda x=x: F.linear(x, w))] + [  # noqa: B023 (timed at once)
                    graph_us(lambda x=x, bn=bn: small_matmul.launch(x, w, bn)) for bn in (0, 8, 16)]  # noqa: B023
                print(f"{name:>10} {linear:>14} {rows:>4} " + " ".join(f"{t:8.2f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
