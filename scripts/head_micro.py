"""The draft's LM head and the verify's argmax alone, in microseconds a call: cuBLAS's bf16 head against the
int8 head of ``eaglet/models/int8_matmul.py`` (a few tiles), and the verify's argmax chunked several ways.

    PYTHONPATH=. python scripts/head_micro.py

Each call is captured in a CUDA graph of 20 calls and replayed (``kernel_micro.graph_us``), so launch gaps
are those of a captured step. "cold": before each call a 256 MiB buffer is zeroed (its time, measured alone,
taken off), so the weight comes from HBM rather than the L2, as at a tree's first draft step after a verify.
Nothing here is torch.compile'd but the argmax variants (dynamic=False, default mode, as the engine).
"""

from __future__ import annotations

import argparse
from functools import partial

import torch

from eaglet.models.int8_linear import quantize_rows
from eaglet.models.int8_matmul import launch
from eaglet.speculative.tree import argmax
from scripts.kernel_micro import graph_us

TILES = [{"BN": 64, "BK": 64, "num_warps": 4, "num_stages": 3}, {"BN": 32, "BK": 64, "num_warps": 2, "num_stages": 3},
         {"BN": 128, "BK": 64, "num_warps": 4, "num_stages": 3}, {"BN": 64, "BK": 128, "num_warps": 4, "num_stages": 2},
         {"BN": 32, "BK": 128, "num_warps": 4, "num_stages": 2}, {"BN": 16, "BK": 64, "num_warps": 1, "num_stages": 3}]


def l2_flush(dev: str) -> tuple[torch.Tensor, float]:
    """A 256 MiB buffer whose zeroing evicts the L2 before a call (``timed``), and that zeroing's own us."""
    buf = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    return buf, graph_us(buf.zero_)


def timed(fn, flush: torch.Tensor | None, flush_us: float) -> float:
    if flush is None:
        return graph_us(fn)
    return graph_us(lambda: (flush.zero_(), fn())[1]) - flush_us


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocabs", type=int, nargs="+", default=[24576, 49152])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--argmax-rows", type=int, nargs="+", default=[1, 8, 48])
    a = ap.parse_args()
    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    buf, flush_us = l2_flush(dev)
    print(f"flush alone {flush_us:.1f} us")
    tiles = " ".join(f"{'int8 ' + str(i):>7}" for i in range(len(TILES)))
    print(f"{'head':>12} {'rows':>4} {'cache':>5} {'bf16':>7} {tiles}  (us a call)", flush=True)
    for v in a.vocabs:
        w = torch.randn(v, a.hidden, device=dev, dtype=bf) * 0.05
        q, s = quantize_rows(w)
        ref_w = (q.float() * s[:, None]).to(bf)
        for m in a.rows:
            x = torch.randn(m, a.hidden, device=dev, dtype=bf)
            ref = x.float() @ ref_w.float().T
            tiles = []  # those that compile and give the product; a tile that fails is reported and left out
            for i, tile in enumerate(TILES):
                try:
                    err = (launch(x, q, s, tile).float() - ref).abs().max().item()
                except Exception as e:  # a tile this Triton or GPU cannot build
                    print(f"int8 {i} failed: {type(e).__name__}: {str(e)[:200]}")
                    continue
                if err < 0.05 * ref.abs().max().item():
                    tiles.append(tile)
                else:
                    print(f"int8 {i} is off by {err}")
            for cache, flush in (("L2", None), ("cold", buf)):
                row = [timed(partial(torch.nn.functional.linear, x, w), flush, flush_us)]
                row += [timed(partial(launch, x, q, s, tile), flush, flush_us) if tile in tiles else float("nan")
                        for tile in TILES]
                print(f"{f'{v}x{a.hidden}':>12} {m:>4} {cache:>5} " + " ".join(f"{u:7.2f}" for u in row), flush=True)
    for i, tile in enumerate(TILES):
        print(f"int8 {i}: {tile}")

    chunks = " ".join(f"{f'chunk {c}':>10}" for c in (128, 512, 1024, 2048))
    print(f"\n{'argmax':>12} {'rows':>4} {'eager':>7} {chunks}")
    for r in a.argmax_rows:
        x = torch.randn(r, 49152, device=dev, dtype=bf)
        ref = x.argmax(-1)
        row = [graph_us(partial(torch.argmax, x, -1))]
        for c in (128, 512, 1024, 2048):
            f = torch.compile(lambda t, c=c: argmax(t, c), dynamic=False)
            assert torch.equal(f(x), ref)
            row.append(graph_us(partial(f, x)))
        print(f"{'49152':>12} {r:>4} " + " ".join(f"{u:7.2f}" if i == 0 else f"{u:10.2f}" for i, u in enumerate(row)),
              flush=True)


if __name__ == "__main__":
    main()
