"""Regeneration speed: answer tokens per second of ``eaglet.data.regenerate.regenerate``.

    PYTHONPATH=. python scripts/bench_regenerate.py --target smollm2-135m --prompts 64 --batch 16
    PYTHONPATH=. python scripts/bench_regenerate.py --target random:tiny --prompts 256 --batch 64
    PYTHONPATH=. python scripts/bench_regenerate.py --target smollm2-135m --device cuda --prompts 4096 --batch 512 \
        --repeat 2

The prompts are a seeded sample of the built-in corpus's training prompts, answered greedily
into a fresh file. ``random:NAME`` is a random-weight model of that shape with SmolLM2's
tokenizer (its answers almost never end early: every one runs to --max-new-tokens).
Prints one JSON line: answers, answer tokens, wall seconds, tok/s, CPU seconds of this process
(on a shared machine the wall time also counts other jobs; the CPU time mostly not), and the
target prefills run (eager forwards, graph replays, the prompts they held, their tokens, and the
tokens with padding), the wall seconds in admissions (``admit_s``) and in steps (``step_s``; each ends in a
host read, so the GPU's work is inside), the steps, and ``busy_rows``: the mean share of the batch's rows
running after a step (the rest wait to be refilled, or idle in the drain at the end). ``--profile FILE``
runs the last repeat under torch.profiler and writes its costliest ops.
Regeneration admits eagerly (``refill.GRAPHED_PREFILL``); ``--graphed-prefill``
admits through the prefill graphs instead, as a server does.
``--admit-wait N`` sets ``refill.ADMIT_WAIT`` (admit once batch/N rows are free; a
huge N: whenever one is).
``--repeat 2`` runs the same regeneration twice in one process and prints a line for each
(``"run": 1``, ``2``): on CUDA the first includes compiling the decode chunk (~40 s for
SmolLM2 at batch 512 on an H200); the second finds torch's compile caches warm and pays only
tracing and CUDA-graph capture (seconds), so it is the steady rate to quote.
The signature of ``regenerate`` is the one before continuous refill too, so
``PYTHONPATH=<older checkout>`` measures the older code with this same script.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

import eaglet.data.refill
import eaglet.generate
import eaglet.prefill
import eaglet.session
from eaglet.data.prompts import load_conversations
from eaglet.data.regenerate import regenerate
from eaglet.loading.target import Target, build_model, load_target, load_tokenizer, resolve_target_dir
from eaglet.models.config import ModelConfig
from eaglet.sampling import SamplingParams

SHAPES = {  # random-weight targets; SmolLM2's vocabulary, so its tokenizer serves
    "tiny": dict(model_type="llama", vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2,
                 num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, max_position_embeddings=2048,
                 tie_word_embeddings=True),
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0,
                         max_position_embeddings=8192, tie_word_embeddings=True),
}


def random_target(name: str, dtype, device) -> Target:
    cfg = ModelConfig(**SHAPES[name])
    model = build_model(cfg, dtype, device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=gen)
    return Target(model, load_tokenizer(resolve_target_dir("smollm2-135m")), cfg, f"random:{name}", None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m", help="a target, or random:tiny / random:smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--batch", type=int, help="rows (default: regeneration's own, refill.auto_rows)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=1,
                   help="run N times in this process, one line each; runs after the first find the compile done")
    p.add_argument("--admit-wait", type=int, help="refill.ADMIT_WAIT (default: the code's own)")
    p.add_argument("--profile", metavar="FILE",
                   help="run the last repeat under torch.profiler and write its 30 costliest ops (device time) here")
    p.add_argument("--graphed-prefill", action="store_true",
                   help="admissions through the prefill graphs (eaglet/prefill.py), not eagerly")
    a = p.parse_args()
    if a.admit_wait is not None:
        eaglet.data.refill.ADMIT_WAIT = a.admit_wait
    eaglet.data.refill.GRAPHED_PREFILL = a.graphed_prefill
    counts = {"prefills": 0, "prefill_prompts": 0, "prefill_tokens": 0, "prefill_padded": 0, "graphed_prefills": 0,
                "admit_s": 0.0, "step_s": 0.0, "steps": 0, "row_steps": 0, "rows": 0}
    prefill, graphed = eaglet.session.prefill, eaglet.prefill.PrefillGraphs.run

    def replayed(self, prompts, *extra):  # a graphed admission (counted apart; its tokens are counted too)
        counts["graphed_prefills"] += 1
        counts["prefill_prompts"] += len(prompts)
        counts["prefill_tokens"] += sum(map(len, prompts))
        rows, length = self.bucket(len(prompts), max(map(len, prompts)))
        counts["prefill_padded"] += rows * length
        return graphed(self, prompts, *extra)

    eaglet.prefill.PrefillGraphs.run = replayed

    def counted(target, cache, prompts):  # every eager regeneration prefill is a Session's (older code's too)
        counts["prefills"] += 1
        counts["prefill_prompts"] += len(prompts)
        counts["prefill_tokens"] += sum(map(len, prompts))
        counts["prefill_padded"] += len(prompts) * max(map(len, prompts))  # what the right-padded forward runs
        return prefill(target, cache, prompts)

    eaglet.session.prefill = counted

    def timed(name, fn):  # wall seconds in a Session method (each ends in a host read, so the GPU work is in it)
        def wrapper(self, *args, **kw):
            t = time.perf_counter()
            try:
                return fn(self, *args, **kw)
            finally:
                counts[f"{name}_s"] += time.perf_counter() - t
                if name == "step":
                    counts["steps"] += 1
                    counts["row_steps"] += len(self.running())  # rows still running after it
                    counts["rows"] = self.batch
        return wrapper

    eaglet.session.Session.admit = timed("admit", eaglet.session.Session.admit)
    eaglet.session.Session.step = timed("step", eaglet.session.Session.step)
    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    if a.target.startswith("random:"):
        target = random_target(a.target.split(":", 1)[1], dtype, a.device)
    else:
        target = load_target(a.target, dtype=dtype, device=a.device)
    convs = [c for c in load_conversations("builtin") if c.split != "val"]
    convs = random.Random(0).sample(convs, a.prompts)
    params = SamplingParams(max_new_tokens=a.max_new_tokens, seed=0)
    for run in range(1, a.repeat + 1):
        for k in counts:
            counts[k] = 0
        with tempfile.TemporaryDirectory() as tmp:
            cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            profiling = a.profile and run == a.repeat
            with torch.profiler.profile(activities=_activities(a.device)) if profiling else nullcontext() as prof:
                stats = regenerate(target, convs, Path(tmp) / "r.jsonl", params, a.batch, progress=False)
            seconds, cpu1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        if profiling:
            costliest = prof.key_averages().table(sort_by=f"self_{_kind(a.device)}_time_total", row_limit=30)
            Path(a.profile).write_text(costliest)
        cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
        for k in ("admit_s", "step_s"):
            counts[k] = round(counts[k], 2)
        busy = counts["row_steps"] / max(1, counts["steps"] * counts["rows"])  # mean share of rows running
        print(json.dumps({"run": run, "target": a.target, "device": a.device, "batch": a.batch,
                          "busy_rows": round(busy, 3),
                          "max_new_tokens": a.max_new_tokens, "answers": stats.written, "too_long": stats.too_long,
                          "tokens": stats.tokens, "seconds": round(seconds, 2),
                          "tok_s": round(stats.tokens / seconds, 1),
                          "cpu_seconds": round(cpu, 1), "tok_per_cpu_s": round(stats.tokens / max(cpu, 1e-9), 2),
                          **counts, "threads": torch.get_num_threads()}), flush=True)


def _kind(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "cpu"


def _activities(device: str) -> list:
    cpu = torch.profiler.ProfilerActivity.CPU
    return [cpu, torch.profiler.ProfilerActivity.CUDA] if _kind(device) == "cuda" else [cpu]


if __name__ == "__main__":
    main()
