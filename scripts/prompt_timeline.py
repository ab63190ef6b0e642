"""Where a prompt's fixed cost goes at batch 1, plain decoding and speculation: the session's opening, the
admission (prefill and first token), each step (a chunk of plain steps, or an iteration), the spare steps the
last chunk computes past a stop, and the release, in wall milliseconds.

    PYTHONPATH=. python scripts/prompt_timeline.py --target /tmp/smol.gguf --prompts builtin --limit 40

On the H200 `eaglet bench`'s ``seconds_fit`` put ~11.5 ms on each plain answer beside 0.934 ms a token, and
~9.7 ms on each speculative one (session 16, ~150 tokens an answer): ~8% and ~14% of the time. This splits
that. The device is synchronised around every phase, which adds a little to each; the phases' medians are
the point, not their sum. Warm-up first, as bench's: every prompt with a few tokens (each prefill bucket's
graph), then two at full length (the step's compile and capture).

``--profile N`` then profiles N admissions of each method (a session of one row opened, the prompt admitted, the
row released; synchronised around each): the wall time a prompt against the device's busy time, the kernels, the
host's waits on the device (stream synchronisations, copies from the host's pageable memory) and the host's
costliest operators, where the admission's time is the host's rather than the device's. ``--random SHAPE`` times
random weights of one of scripts/bench_decode.py's shapes with a random draft (no GGUF to stage; prompts of
``--prompt-len`` random tokens; the steps' figures then mean nothing, an admission's do).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eaglet.bench.prompts import load_prompt_sets
from eaglet.chat import encode_chat
from eaglet.generate import PlainGenerator
from eaglet.loading import load_target
from eaglet.options import EngineOptions, SamplingParams


def sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def timeline(gen, prompt: list[int], params: SamplingParams, device: torch.device) -> dict:
    """One prompt through a batch-1 session, phase by phase (ms), with its tokens and steps."""
    t0 = sync(device)
    session = gen.session(1, params)
    t1 = sync(device)
    session.admit(0, [prompt], params)
    t2 = sync(device)
    steps = []
    while session.running():
        a = time.perf_counter()
        session.step()  # reads its result on the host: synchronised
        steps.append((time.perf_counter() - a) * 1e3)
    t3 = sync(device)
    out = session.release(0)
    t4 = sync(device)
    return {"open": (t1 - t0) * 1e3, "admit": (t2 - t1) * 1e3, "steps": steps, "release": (t4 - t3) * 1e3,
            "tokens": len(out.tokens), "stopped": out.finish_reason == "stop"}


def summary(name: str, rows: list[dict], chunk: int) -> str:
    steps = [s for r in rows for s in r["steps"]]
    per_answer = [len(r["steps"]) for r in rows]
    tokens = statistics.mean(r["tokens"] for r in rows)
    spare = ""
    if chunk > 1:  # plain chunks: the tokens after the first (admission's), the stop's EOS included, take steps
        spare = f" {statistics.mean(len(r['steps']) * chunk - (r['tokens'] - 1 + r['stopped']) for r in rows):6.1f}"
    med = statistics.median
    return (f"{name:>6} {len(rows):>7} {tokens:7.1f} {med(r['open'] for r in rows):7.2f} "
            f"{med(r['admit'] for r in rows):7.2f} {med(steps):7.3f} {statistics.mean(per_answer):7.1f} "
            f"{med(r['steps'][-1] for r in rows):7.3f} {med(r['release'] for r in rows):8.3f}{spare or '      -'}")


def profile_admissions(gen, prompts: list[list[int]], params: SamplingParams, device: torch.device, name: str,
                       top: int = 15) -> None:
    """Where N admissions' time goes (see the module's docstring), printed as a short table."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    walls = []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, with_stack=True) as prof:
        for prompt in prompts:
            session = gen.session(1, params)
            t0 = sync(device)
            session.admit(0, [prompt], params)
            walls.append((sync(device) - t0) * 1e3)
            session.release(0)
    n = len(prompts)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / n
    print(f"\n-- {name}: {n} admissions, {statistics.median(walls):.3f} ms each (median wall); a prompt's session "
          f"(opened, admitted, released): device busy {busy:.3f} ms, {len(kernels) / n:.0f} kernels, and on the host:")
    waits = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync",
             "cudaGraphLaunch", "cudaLaunchKernel")
    host = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CPU]
    calls = {e.key: e for e in host if e.key in waits}
    print("   " + ", ".join(f"{k} {calls[k].count / n:.1f}x {calls[k].self_cpu_time_total / 1e3 / n:.3f} ms"
                          for k in waits if k in calls))
    for e in sorted(host, key=lambda e: -e.self_cpu_time_total)[:top]:
        print(f"{e.self_cpu_time_total / 1e3 / n:8.3f} ms {e.count / n:6.1f}x  {e.key[:100]}")
    # Where the host waits for the device: each synchronisation's innermost eaglet frames.
    for e in prof.key_averages(group_by_stack_n=8):
        if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize"):
            frames = [f for f in e.stack if "eaglet/" in f][:3]
            print(f"   {e.key} {e.count / n:.1f}x from " + " <- ".join(frames or ["(no eaglet frame)"]))


def random_gens(shape: str, device: str, compile_prefill: bool, draft: bool) -> dict:
    """Plain and speculative generators over random weights of ``shape`` (scripts/bench_decode.py)."""
    from eaglet.speculative import SpecEngine
    from scripts.bench_decode import random_draft, random_target

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    target = random_target(shape, dtype, torch.device(device))
    gens = {"plain": PlainGenerator(target, compile_prefill=compile_prefill)}
    if draft:  # as spec_engine builds it from a draft on disk, with the batch-1 default tree
        fused = EngineOptions(compile_prefill=compile_prefill).fused_prefill(torch.device(device))
        gens["spec"] = SpecEngine(target, random_draft(target, 24576), None, adaptive=False, compile_prefill=fused,
                                  log=lambda _: None)
    return gens


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="default", help="the draft for spec ('none': plain only)")
    ap.add_argument("--prompts", default="builtin")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compile-prefill", action="store_true", help="the prefill buckets fused (the engines' flag)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="also profile N admissions of each method")
    ap.add_argument("--random", metavar="SHAPE", help="random weights of this shape instead of --target")
    ap.add_argument("--prompt-len", type=int, default=160, help="with --random: each prompt's random tokens")
    a = ap.parse_args()
    params = SamplingParams(max_new_tokens=a.max_new_tokens)
    if a.random:
        gens = random_gens(a.random, a.device, a.compile_prefill, a.draft != "none")
        device = torch.device(a.device)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, 1000, (a.prompt_len,), generator=g).tolist() for _ in range(a.limit)]
    else:
        dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
        target = load_target(a.target, dtype=dtype, device=a.device)
        device = target.model.embed.weight.device
        prompts = [encode_chat(target.tokenizer, p.messages) for p in load_prompt_sets(a.prompts, a.limit)]
        gens = {"plain": PlainGenerator(target, compile_prefill=a.compile_prefill)}
        if a.draft != "none":
            from eaglet.speculative.load import resolve_draft, spec_engine

            options = EngineOptions(policy=False, compile_prefill=a.compile_prefill)
            gens["spec"] = spec_engine(target, resolve_draft(a.draft, target), None, options, lambda _: None)
    print(f"{'method':>6} {'prompts':>7} {'tokens':>7} {'open':>7} {'admit':>7} {'step':>7} {'steps':>7} "
          f"{'last':>7} {'release':>8} {'spare':>6}  (ms, medians; tokens, steps and spare steps: means a prompt)")
    for name, gen in gens.items():
        short = SamplingParams(max_new_tokens=2)
        for i, p in enumerate(prompts):
            timeline(gen, p, params if i < 2 else short, device)
        rows = [timeline(gen, p, params, device) for p in prompts]
        print(summary(name, rows, getattr(gen, "chunk", 1) if name == "plain" else 1), flush=True)
    if a.profile:
        for name, gen in gens.items():
            profile_admissions(gen, prompts[: a.profile], params, device, name)


if __name__ == "__main__":
    main()
