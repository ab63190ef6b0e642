"""Does torch.compile trace the decoder layer once and reuse it (``nested_compile_region``), or once a layer?

    TORCH_LOGS=+hierarchical_compile PYTHONPATH=. python scripts/layer_compile.py --layers 8 30 [--device cuda]

Compiles the decode step, the one-row prefill and the 6,8,48 speculative iteration (a random draft; no CUDA graph) of
random SmolLM2-shaped targets of each ``--layers`` count, each in a fresh process (torch's caches empty), and prints
the compile seconds and how many layers dynamo reused (its "subgraph_reuse: cache hit" lines, "?" where the torch
logs none; "not eligible" says why not). On the 2-core CPU with torch 2.13 no layer was reused while the layers'
region took the ``KVCache`` and ``AttnMeta`` objects ("unsupported input VT types"); since it takes the cache's layer
as tensors (``LayerKV``) and ``AttnMeta`` is a pytree, 29 of 30 are, and at 30 layers the decode step compiled in
20.0 s instead of 51.9, the prefill in 17.5 instead of 47.7 (session 43). torch 2.11 (the device's) logs no reuse but
each region it installs ("regions": one a graph where the layers share theirs): it installed one a layer while the
cache's layers were views of one stacked buffer (their storage offsets differ); since each layer's K and V is an
allocation of its own, two (session 46), and the iteration's verification one region, not 30 (session 47).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def one(layers: int, device: str) -> None:
    import torch

    from eaglet.generate import decode_step, target_prefills
    from eaglet.options import SamplingParams
    from eaglet.speculative import SpecEngine
    from scripts import bench_decode

    bench_decode.SHAPES["probe"] = dict(bench_decode.SHAPES["smollm2-135m"], num_layers=layers)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    target = bench_decode.random_target("probe", dtype, device)
    with torch.inference_mode():
        step = decode_step(target.model, target.model.new_cache(1, 256), static=True, compile=True)
        t0 = time.perf_counter()
        step(torch.ones(1, 1, dtype=torch.long, device=device))
        decode_s = time.perf_counter() - t0
        prefills = target_prefills(target, 1024, False, True, compile=True)
        t0 = time.perf_counter()
        prefills.run([[1] * 15])
        prefill_s = time.perf_counter() - t0
        # The 6,8,48 iteration (the draft's growth, verification over every layer, the commit), eager otherwise;
        # the random draft reads layers 2, L/2 and L-3, so the iteration is compiled from 4 layers up.
        iteration_s = float("nan")
        if layers >= 4:
            draft = bench_decode.random_draft(target, 4096)
            eng = SpecEngine(target, draft, max_context=256, num_steps=6, topk=8, num_draft_tokens=48,
                             use_graphs=False, adaptive=False, compile=True, static_shapes=True)
            t0 = time.perf_counter()
            eng.generate([[1] * 15], SamplingParams(max_new_tokens=4))
            iteration_s = time.perf_counter() - t0
    print(f"RESULT {layers} {decode_s:.1f} {prefill_s:.1f} {iteration_s:.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process's layer count
    a = ap.parse_args()
    if a.one is not None:
        return one(a.one, a.device)
    print(f"{'layers':>6}{'decode s':>10}{'prefill s':>11}{'iteration s':>13}{'reused':>8}{'regions':>9}"
          "  first 'not eligible' reason")
    for n in a.layers:
        env = dict(os.environ, TORCH_LOGS="+hierarchical_compile", TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(),
                   TRITON_CACHE_DIR=tempfile.mkdtemp())
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--device", a.device], env=env,
                             capture_output=True, text=True)
        text = out.stdout + out.stderr
        result = next((line.split()[1:] for line in text.splitlines() if line.startswith("RESULT")), None)
        if result is None:
            print(f"{n:>6}  failed: {text.strip().splitlines()[-1] if text.strip() else out.returncode}")
            continue
        why = next((line.split("not eligible -- ")[1] for line in text.splitlines() if "not eligible" in line), "-")
        # torch 2.11 (the device's, session 44) logs no subgraph reuse at all: its count is then unknown, not 0.
        reused = text.count("cache hit") if "subgraph_reuse" in text else "?"
        # The regions dynamo installed, the decode step's, the prefill's and the iteration's together: 3 where the
        # layers share one.
        regions = text.count("Installing subgraph")
        print(f"{n:>6}{result[1]:>10}{result[2]:>11}{result[3]:>13}{reused:>8}{regions:>9}  {why}")


if __name__ == "__main__":
    main()
