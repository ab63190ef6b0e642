"""The draft's GEMMs alone, bf16 (cuBLAS) against int8 (``eaglet::int8_matmul``), in microseconds a call.

    PYTHONPATH=. python scripts/int8_layer_micro.py --shape llama3-8b --rows 1 8

For a target shape of ``scripts/bench_decode.py`` the draft's six weights as served (``fc`` over three captured
points, the fused q/k/v over the layer's 2H input, ``o_proj``, the fused gate/up, ``down_proj``, the head over
``--draft-vocab`` tokens), each at the rows a draft step runs (1: a chain or a tree's first step; 8: a 6,8,48
tree's later steps). Columns: cuBLAS bf16, then int8 with each of ``VARIANTS`` (``split`` 0: ``split_k``'s
choice). "cold": the L2 flushed before each call (``head_micro.timed``), as where a step's weights come from HBM;
the last rows sum a draft step, in microseconds and as the bytes of its weights read a second (bf16's two a
parameter, int8's one; "GB/s", against an H100's ~3,350 and an H200's ~4,800). A 6,8,48 iteration runs the layer 6
times and the head 6 times.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch
import torch.nn.functional as F

from eaglet.models.int8_linear import quantize_rows
from eaglet.models.int8_matmul import launch
from scripts.bench_decode import SHAPES
from scripts.head_micro import l2_flush, timed

# Overrides of CONFIG (SPLIT 0: split_k's choice; WAVES: the programs a multiprocessor it aims at). Session 53's
# H100 put {"BK": 256, "num_warps": 8, "num_stages": 2} first of its six (now CONFIG, the second row here), at ~60% of
# the card's bandwidth on the step's int8 bytes: the rows after it look for the rest.
VARIANTS = [{"SPLIT": 1}, {"SPLIT": 0}, {"SPLIT": 0, "BK": 64, "num_warps": 4, "num_stages": 3},
            {"SPLIT": 0, "num_warps": 4, "num_stages": 3}, {"SPLIT": 0, "num_stages": 3},
            {"SPLIT": 0, "BK": 512, "num_stages": 2}, {"SPLIT": 0, "BN": 32, "num_warps": 4},
            {"SPLIT": 0, "WAVES": 4}, {"SPLIT": 0, "WAVES": 1}, {"SPLIT": 0, "BN": 128, "BK": 128}]


def gemms(shape: str, draft_vocab: int) -> list[tuple[str, int, int]]:
    """(name, N, K) of the draft's weights [N, K] for a target of ``shape``."""
    c = SHAPES[shape]
    h, i, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    return [("fc", h, 3 * h), ("qkv", (c["num_heads"] + 2 * c["num_kv_heads"]) * d, 2 * h),
            ("o", h, c["num_heads"] * d), ("gate_up", 2 * i, h), ("down", h, i), ("head", draft_vocab, h)]


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--best-out", help="write here, as JSON, the tile whose cold step at the first --rows beats "
                    "CONFIG's by more than 5%% ({} where none does): spec_step_costs.py --int8-tile reads it")
    a = ap.parse_args()
    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    buf, flush_us = l2_flush(dev)
    names = " ".join(f"{'int8 ' + str(i):>8}" for i in range(len(VARIANTS)))
    print(f"{'gemm':>8} {'N x K':>13} {'rows':>4} {'cache':>5} {'bf16':>8} {names}  (us a call)", flush=True)
    params = sum(n * k for _, n, k in gemms(a.shape, a.draft_vocab))
    best = {}
    for m in a.rows:
        totals = {"L2": [0.0] * (len(VARIANTS) + 1), "cold": [0.0] * (len(VARIANTS) + 1)}
        for name, n, k in gemms(a.shape, a.draft_vocab):
            w = torch.randn(n, k, device=dev, dtype=bf) * 0.02
            q, s = quantize_rows(w)
            x = torch.randn(m, k, device=dev, dtype=bf)
            ref = x.float() @ (q.float() * s[:, None]).T
            for v in VARIANTS:  # each variant must give the product before it is timed
                err = (launch(x, q, s, v).float() - ref).abs().max().item()
                assert err < 0.02 * ref.abs().max().item(), (name, v, err)
            for cache, flush in (("L2", None), ("cold", buf)):
                row = [timed(partial(F.linear, x, w), flush, flush_us)]
                row += [timed(partial(launch, x, q, s, v), flush, flush_us) for v in VARIANTS]
                totals[cache] = [t + u for t, u in zip(totals[cache], row)]
                print(f"{name:>8} {f'{n}x{k}':>13} {m:>4} {cache:>5} " + " ".join(f"{u:8.2f}" for u in row),
                      flush=True)
        for cache, row in totals.items():
            print(f"{'step':>8} {'(sum)':>13} {m:>4} {cache:>5} " + " ".join(f"{u:8.2f}" for u in row), flush=True)
            rates = [2 * params / row[0] / 1e3] + [params / u / 1e3 for u in row[1:]]  # bytes / us / 1e3 = GB/s
            print(f"{'GB/s':>8} {'(sum)':>13} {m:>4} {cache:>5} " + " ".join(f"{r:8.0f}" for r in rates), flush=True)
        if m == a.rows[0]:
            best = better_tile(totals["cold"][1:])
    for i, v in enumerate(VARIANTS):
        print(f"int8 {i}: {v} (split 0: split_k's choice)")
    print(f"best tile: {best}")
    if a.best_out:
        with open(a.best_out, "w") as f:
            json.dump(best, f)


def better_tile(us: list[float]) -> dict:
    """The overrides of CONFIG (``SPLIT`` dropped) of the variant whose step took fewest ``us`` where that beats
    CONFIG's own (``{"SPLIT": 0}``, the second variant) by more than 5%; {} where none does."""
    i = min(range(len(us)), key=us.__getitem__)
    return {k: v for k, v in VARIANTS[i].items() if k != "SPLIT"} if us[i] < 0.95 * us[1] else {}


if __name__ == "__main__":
    main()
