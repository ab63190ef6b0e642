"""The target's GEMMs at verify's rows against a plain step's, cuBLAS bf16 against a Triton kernel, us a call.

    PYTHONPATH=. python scripts/verify_gemm_micro.py --shape llama3-8b --rows 1 48

On the Llama-3.1-8B shape a 6,8,48 verify (48 rows) has cost ~0.3 ms of GEMM time more than a plain step (one
row) in cuBLAS (docs/performance.md, "One iteration against one plain step, by kernel"): reading the weights is
the same, so the excess is the kernels cuBLAS picks for 48 rows. The candidate is ``eaglet::int8_matmul``'s
kernel given the bf16 weight itself (its widening a no-op, scales of one): the input split where column blocks
are few, tiles from ``VARIANTS``. Each GEMM with the L2 flushed (a layer's weights never stay there in a step);
the last rows sum a decoder layer's four GEMMs (fused q/k/v, o_proj, fused gate/up, down_proj) times the layers,
plus the LM head, in ms a step, and as GB/s of weights read.
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import torch.nn.functional as F

from eaglet.models.int8_matmul import launch
from scripts.bench_decode import SHAPES
from scripts.head_micro import l2_flush, timed

VARIANTS = [{"SPLIT": 0}, {"SPLIT": 0, "BK": 128, "num_warps": 4, "num_stages": 3},
            {"SPLIT": 0, "BK": 128, "num_stages": 3}, {"SPLIT": 0, "BN": 128, "BK": 64, "num_stages": 4},
            {"SPLIT": 0, "BK": 64, "num_warps": 4, "num_stages": 4}, {"SPLIT": 0, "WAVES": 4, "BK": 128}]


def gemms(shape: str) -> list[tuple[str, int, int, int]]:
    """(name, N, K, calls a step) of the target's weights [N, K]."""
    c = SHAPES[shape]
    h, i, d, n = c["hidden_size"], c["intermediate_size"], c["head_dim"], c["num_layers"]
    return [("qkv", (c["num_heads"] + 2 * c["num_kv_heads"]) * d, h, n), ("o", h, c["num_heads"] * d, n),
            ("gate_up", 2 * i, h, n), ("down", h, i, n), ("lm_head", c["vocab_size"], h, 1)]


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 48])
    a = ap.parse_args()
    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    buf, flush_us = l2_flush(dev)
    names = " ".join(f"{'triton ' + str(i):>9}" for i in range(len(VARIANTS)))
    print(f"{'gemm':>8} {'N x K':>13} {'rows':>4} {'cublas':>9} {names}  (us a call, L2 flushed)", flush=True)
    params = sum(n * k * calls for _, n, k, calls in gemms(a.shape))
    for m in a.rows:
        total = [0.0] * (len(VARIANTS) + 1)
        for name, n, k, calls in gemms(a.shape):
            w = torch.randn(n, k, device=dev, dtype=bf) * 0.02
            ones = torch.ones(n, device=dev)
            x = torch.randn(m, k, device=dev, dtype=bf)
            ref = x.float() @ w.float().T
            for v in VARIANTS:  # each variant must give the product before it is timed
                err = (launch(x, w, ones, v).float() - ref).abs().max().item()
                assert err < 0.02 * ref.abs().max().item(), (name, v, err)
            row = [timed(partial(F.linear, x, w), buf, flush_us)]
            row += [timed(partial(launch, x, w, ones, v), buf, flush_us) for v in VARIANTS]
            total = [t + u * calls for t, u in zip(total, row)]
            print(f"{name:>8} {f'{n}x{k}':>13} {m:>4} " + " ".join(f"{u:9.2f}" for u in row), flush=True)
            del w, x
        print(f"{'step ms':>8} {'(sum)':>13} {m:>4} " + " ".join(f"{u / 1e3:9.3f}" for u in total), flush=True)
        print(f"{'GB/s':>8} {'(sum)':>13} {m:>4} " + " ".join(f"{2 * params / u / 1e3:9.0f}" for u in total),
              flush=True)
    for i, v in enumerate(VARIANTS):
        print(f"triton {i}: {v} (split 0: split_k's choice)")


if __name__ == "__main__":
    main()
