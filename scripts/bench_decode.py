"""Plain greedy decode speed of our runtime, against transformers and the bandwidth floor.

    python scripts/bench_decode.py --target smollm2-135m            # CPU: ours vs HF generate
    python scripts/bench_decode.py --target smollm2-135m --device cuda --no-hf
    python scripts/bench_decode.py --target random:llama3-8b --device cuda --no-hf --batch 1 16

Prints one row per (model, batch): tok/s (median of repeats after a warm-up), ms per
step, and on CUDA the floor = weight bytes / measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import torch

from eaglet.chat import encode_chat
from eaglet.generate import PlainGenerator
from eaglet.loading.target import Target, build_model, load_target
from eaglet.models import attention
from eaglet.models.config import ModelConfig
from eaglet.sampling import SamplingParams

SHAPES = {  # random-weight targets of published shapes (speed does not depend on the values)
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0,
                         max_position_embeddings=8192, tie_word_embeddings=True),
    "llama3-8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
                      max_position_embeddings=8192),
}
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def random_target(name: str, dtype, device) -> Target:
    cfg = ModelConfig(**SHAPES[name])
    model = build_model(cfg, dtype, device, max_pos=8192)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=gen)
    return Target(model, None, cfg, f"random:{name}", None)


def random_draft(target: Target, draft_vocab: int, intermediate_size: int | None = None):
    """A randomly initialised EAGLE-3 draft of ``target``'s shape (its MLP ``intermediate_size`` wide if given), as
    served (fused projections, the first ``draft_vocab`` tokens): costs do not depend on the values."""
    from eaglet.capture import CaptureSpec
    from eaglet.draft.model import DraftConfig, Eagle3Draft

    cfg, p = target.config, target.model.embed.weight
    draft = Eagle3Draft(DraftConfig.for_target(cfg, CaptureSpec.eagle3_default(cfg.num_layers), draft_vocab,
                                               intermediate_size=intermediate_size))
    draft = draft.to(p.device, p.dtype).eval().requires_grad_(False).fuse_projections()
    draft.set_vocab(torch.arange(draft_vocab, device=p.device))
    return draft


def copy_bandwidth(device) -> float:
    """Bytes per second of a large device-to-device copy (read + write counted)."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (time.perf_counter() - t)


def time_ours(target: Target, prompt: list[int], batch: int, new: int, repeats: int,
              compile: bool | None, chunk: int | None = None) -> list[float]:
    gen = PlainGenerator(target, max_context=1024, compile=compile, chunk=chunk)
    params = SamplingParams(max_new_tokens=new)
    gen.generate([prompt] * batch, params)  # warm-up: graph capture / compilation
    out = []
    for _ in range(repeats):
        if target.model.embed.weight.is_cuda:
            torch.cuda.synchronize()
        done = gen.generate([prompt] * batch, params)
        out.append(sum(len(c.tokens) for c in done) / done[0].seconds)
    return out


def time_hf(target: Target, prompt: list[int], new: int, repeats: int) -> tuple[list[float], list[int]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(target.path), dtype=target.model.embed.weight.dtype)
    hf = hf.to(target.model.embed.weight.device).eval()
    ids = torch.tensor([prompt], device=hf.device)
    kw = dict(max_new_tokens=new, do_sample=False, pad_token_id=0)
    hf.generate(ids, **kw)
    out, toks = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        res = hf.generate(ids, **kw)
        out.append((res.shape[1] - ids.shape[1]) / (time.perf_counter() - t))
        toks = res[0, ids.shape[1]:].tolist()
    return out, toks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="CUDA graphs without torch.compile fusion")
    ap.add_argument("--attention", default="auto", choices=["auto", "sdpa", "grouped"])
    ap.add_argument("--chunk", type=int, default=None,
                    help="steps per host read (default: PlainGenerator's; 1 = one step per read)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    attention.IMPL = a.attention
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    if a.target.startswith("random:"):
        target = random_target(a.target.split(":", 1)[1], dtype, a.device)
        prompt = list(range(100, 164))
    else:
        target = load_target(a.target, dtype=dtype, device=a.device)
        prompt = encode_chat(target.tokenizer, [{"role": "user", "content": PROMPT}])
    weight_bytes = sum(p.numel() * p.element_size() for p in target.model.parameters())
    bw = copy_bandwidth(a.device) if a.device == "cuda" else None
    rows = []
    for b in a.batch:
        tps = time_ours(target, prompt, b, a.new_tokens, a.repeats, False if a.no_compile else None, a.chunk)
        med = statistics.median(tps)
        row = {"model": target.name, "device": a.device, "dtype": str(dtype), "batch": b,
               "compiled": a.device == "cuda" and not a.no_compile, "attention": a.attention, "chunk": a.chunk,
               "ours_tok_s": round(med, 1), "ms_per_step": round(1000 * b / med, 3)}
        if bw:
            row["floor_ms"] = round(1000 * weight_bytes / bw, 3)
            row["x_floor"] = round(row["ms_per_step"] / row["floor_ms"], 2)
            row["copy_TBps"] = round(bw / 1e12, 2)
        rows.append(row)
    # Peak resident memory of our runtime alone, before transformers loads its copy.
    rows[0]["ours_max_rss_MB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    if not a.no_hf and target.path is not None:
        hf_tps, hf_toks = time_hf(target, prompt, a.new_tokens, a.repeats)
        rows[0]["hf_tok_s"] = round(statistics.median(hf_tps), 1)
        rows[0]["ours_over_hf"] = round(rows[0]["ours_tok_s"] / rows[0]["hf_tok_s"], 2)
        mine = PlainGenerator(target, max_context=1024).generate(
            [prompt], SamplingParams(max_new_tokens=a.new_tokens))[0].tokens
        rows[0]["same_tokens_as_hf"] = mine == hf_toks[: len(mine)]
    rows[0]["threads"] = torch.get_num_threads()
    rows[0]["cpus"] = os.cpu_count()
    for r in rows:
        print(json.dumps(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
