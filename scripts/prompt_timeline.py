"""Where a prompt's fixed cost goes at batch 1, plain decoding and speculation: the session's opening, the
admission (prefill and first token), each step (a chunk of plain steps, or an iteration), the spare steps the
last chunk computes past a stop, and the release, in wall milliseconds.

    PYTHONPATH=. python scripts/prompt_timeline.py --target /tmp/smol.gguf --prompts builtin --limit 40

On the H200 `eaglet bench`'s ``seconds_fit`` put ~11.5 ms on each plain answer beside 0.934 ms a token, and
~9.7 ms on each speculative one (session 16, ~150 tokens an answer): ~8% and ~14% of the time. This splits
that. The device is synchronised around every phase, which adds a little to each; the phases' medians are
the point, not their sum. Warm-up first, as bench's: every prompt with a few tokens (each prefill bucket's
graph), then two at full length (the step's compile and capture).
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
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    target = load_target(a.target, dtype=dtype, device=a.device)
    device = target.model.embed.weight.device
    prompts = [encode_chat(target.tokenizer, p.messages) for p in load_prompt_sets(a.prompts, a.limit)]
    params = SamplingParams(max_new_tokens=a.max_new_tokens)
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


if __name__ == "__main__":
    main()
