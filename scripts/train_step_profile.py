"""Where one training step's time goes: the target's features, the draft's TTT unroll and its backward,
the optimizer; then the costliest kernels of whole steps.

    PYTHONPATH=. python scripts/train_step_profile.py --device cuda --batch-tokens 16384 --len 512

Random weights of a named target shape (scripts/bench_decode.py) and a fresh draft of its shape and a
draft vocabulary of ``--draft-vocab``, random token rows of ``--len`` tokens (every token an assistant
token), as ``eaglet train`` runs a step (``eaglet.train.probe.StepRig``, which a budgeted run times before it
regenerates): ``Featurizer`` (online target forward with capture), ``TTTLoss`` under bf16 autocast on CUDA,
backward, gradient clipping, AdamW. Times are medians of ``--steps`` after
two warm-up steps (CUDA events per phase on CUDA, wall clock on the CPU), for each of ``--variants``: the
step eagerly with the masked attention (the CPU's default), with ``--compile-loss`` (the loss's soft
cross-entropy through torch.compile), with ``--fused-ttt-attention`` (the TTT attention without its dense
mask), with both (CUDA's default since session 18); the
first warm-up step, a compile included, is printed too. The shipped SmolLM2 draft's run trained at 0.178 s a step of 16k
padded tokens on the H200 (docs/training.md): this says why.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eaglet.train.probe import StepRig
from eaglet.train_options import TrainConfig
from scripts.bench_decode import random_target
from scripts.spec_step_costs import kernel_profile

VARIANTS = {"eager": {"compile_loss": False, "fused_ttt_attention": False},
            "compile-loss": {"compile_loss": True, "fused_ttt_attention": False},
            "fused-attention": {"compile_loss": False, "fused_ttt_attention": True},
            "both": {"compile_loss": True, "fused_ttt_attention": True}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="smollm2-135m", help="a shape of scripts/bench_decode.py")
    ap.add_argument("--draft-vocab", type=int, default=24576)
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--len", type=int, default=512, help="tokens a row (rows = batch tokens / len)")
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5, help="timed steps after two warm-up steps")
    ap.add_argument("--profile", type=int, default=25, metavar="N", help="the N costliest kernels (CUDA; 0: none)")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                    help="the step eagerly with the masked attention, with --compile-loss, with "
                         "--fused-ttt-attention, with both (CUDA's default): each timed in turn")
    a = ap.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    target = random_target(a.shape, torch.bfloat16 if cuda else torch.float32, a.device)

    def mark():
        if cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def between(x, y) -> float:  # ms
        if cuda:
            torch.cuda.synchronize()
            return x.elapsed_time(y)
        return (y - x) * 1e3

    for mode in a.variants:
        rig = StepRig(target, TrainConfig(ttt_steps=a.ttt_steps, batch_tokens=a.batch_tokens,
                                          draft_vocab_size=a.draft_vocab, **VARIANTS[mode]), dev, a.len)
        t0 = time.perf_counter()
        rig.step()
        if cuda:
            torch.cuda.synchronize()
        first = time.perf_counter() - t0
        rig.step()
        phases = ("features", "TTT forward", "backward", "clip + AdamW")
        times: dict[str, list[float]] = {p: [] for p in (*phases, "step")}
        for _ in range(a.steps):
            m = rig.step(mark)
            for p, x, y in zip(phases, m, m[1:]):
                times[p].append(between(x, y))
            times["step"].append(between(m[0], m[-1]))
        print(f"{a.shape}, {len(rig.rows)} rows x {a.len} tokens, draft vocabulary {a.draft_vocab}, "
              f"{a.ttt_steps} TTT steps, {a.device}, variant {mode}: median ms of {a.steps} steps "
              f"(the first step took {first:.1f} s)")
        for p, ts in times.items():
            print(f"{p:>14} {statistics.median(ts):9.2f}")
        if cuda and a.profile:
            kernel_profile(rig.step, f"whole training steps, variant {mode}", a.profile, reps=3)
            print(f"peak memory {torch.cuda.max_memory_allocated(dev) / 2**30:.1f} GiB")

if __name__ == "__main__":
    main()
