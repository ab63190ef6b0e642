"""Which prompt lengths pay a first-use cost in the prefill, and which attention path pays it.

    PYTHONPATH=. python scripts/prefill_first_use.py --device cuda            # H200: every mode, one table
    PYTHONPATH=. python scripts/prefill_first_use.py --device cpu --lengths 5 9 --modes auto   # smoke test

On the H200, `eaglet bench` showed plain decoding paying 0.5-1 s on the first prompt of some
lengths (51, 52, 64, 80, 86, 108, 154, 184, 252 of 88 prompts) and nothing on later prompts of a
similar length: kernels built for a new shape. This times the prefill (random SmolLM2-shaped
weights, one row) at each length twice, first use and again, per mode; each mode runs in a fresh
process with fresh Triton and inductor caches, so the first use is a true first use:
- ``auto``: eaglet's default (the Triton kernel for prefills of at most 128 tokens, SDPA above);
- ``sdpa``: SDPA for every length (no Triton kernel in the prefill);
- ``auto-no-cudnn``: as auto, with SDPA's cuDNN backend off (another backend serves the masked SDPA);
- ``generate``: not the prefill alone but ``PlainGenerator.generate`` of 16 tokens (compiled, graphed
  on CUDA), as `eaglet bench` times it: if only this mode spikes, the cost is outside the prefill.
A length counts as a first-use spike when its first prefill takes over ``--spike-ms`` more than its
second. The table says, per mode, how many spikes, their total seconds and the lengths.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MODES = ("auto", "sdpa", "auto-no-cudnn", "generate")
# The prompt lengths of the H200 bench run (88 chat prompts), in the order it met them.
BENCH_LENGTHS = [201, 86, 252, 141, 184, 145, 260, 154, 133, 201, 267, 204, 118, 225, 204, 87, 258, 130, 157, 310,
                 245, 51, 121, 238, 138, 108, 236, 123, 103, 251, 126, 109, 251, 52, 118, 245, 124, 99, 258, 135, 68,
                 68, 74, 71, 56, 64, 75, 65, 69, 61, 68, 59, 94, 74, 78, 70, 77, 77, 111, 69, 64, 70, 56, 73, 68, 65,
                 80, 71, 56, 73, 148, 127, 116, 103, 134, 119, 56, 54, 54, 53, 81, 50, 56, 53, 56, 52, 56, 54]


def run_mode(mode: str, device: str, lengths: list[int]) -> list[dict]:
    import torch

    import eaglet.models.attention as attention
    from eaglet.generate import prefill
    from scripts.bench_decode import random_target

    if mode == "sdpa":
        attention.IMPL = "sdpa"
    if mode == "auto-no-cudnn" and device == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    target = random_target("smollm2-135m", dtype, device)
    cache = target.model.new_cache(1, 4096)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    if mode == "generate":
        from eaglet.generate import PlainGenerator
        from eaglet.sampling import SamplingParams

        gen, params = PlainGenerator(target, 4096), SamplingParams(max_new_tokens=16)

    def once(n: int) -> float:
        cache.reset()
        ids = torch.randint(0, target.config.vocab_size, (n,)).tolist()
        sync()
        t0 = time.perf_counter()
        if mode == "generate":
            gen.generate([ids], params)
        else:
            prefill(target, cache, [ids]).argmax(-1).tolist()
        return time.perf_counter() - t0

    once(lengths[0])  # the first call of all (lazy init, allocator): not a shape's cost
    rows = []
    with torch.inference_mode():
        for n in lengths:
            first, again = once(n), once(n)
            rows.append({"mode": mode, "length": n, "first_ms": round(first * 1e3, 2),
                         "again_ms": round(again * 1e3, 2)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--lengths", type=int, nargs="+", default=BENCH_LENGTHS)
    ap.add_argument("--spike-ms", type=float, default=50.0)
    ap.add_argument("--out", default=None, help="write every row as JSON lines here too")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:  # one mode in this process
        print(json.dumps(run_mode(a.child, a.device, a.lengths)))
        return
    rows = []
    for mode in a.modes:
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, TRITON_CACHE_DIR=f"{tmp}/triton", TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor",
                       PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
            out = subprocess.run([sys.executable, __file__, "--device", a.device, "--child", mode, "--lengths",
                                  *map(str, a.lengths)], env=env, capture_output=True, text=True)
        if out.returncode:
            print(f"{mode}: failed\n{out.stderr[-2000:]}")
            continue
        rows += json.loads(out.stdout.strip().splitlines()[-1])
    if a.out:
        with open(a.out, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{'mode':<15}{'spikes':>7}{'spike s':>9}{'median again ms':>17}  lengths that spiked")
    for mode in a.modes:
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        spikes = [r for r in mine if r["first_ms"] - r["again_ms"] > a.spike_ms]
        again = sorted(r["again_ms"] for r in mine)[len(mine) // 2]
        total = sum(r["first_ms"] - r["again_ms"] for r in spikes) / 1e3
        print(f"{mode:<15}{len(spikes):>7}{total:>9.2f}{again:>17.2f}  {sorted({r['length'] for r in spikes})}")


if __name__ == "__main__":
    main()
