"""Which fixed tree decodes fastest for a target and draft: plain decoding and every tree, prompt by prompt.

    PYTHONPATH=. python scripts/tree_sweep.py --trees 5,2,8 6,2,10 4,2,6 --out runs/trees.jsonl

A tree may name how its draft's LM head is served: ``5,2,8:float@12288`` (float32, cut to the 12,288 most frequent
tokens), ``5,2,8:int8`` (int8, the whole vocabulary); without either, as ``bench`` serves it (``--draft-vocab``,
then the device's default). After the head, ``+layer`` serves the draft's fc and layer in int8
(``--int8-draft-layer``) and ``+float-layer`` keeps them float: ``5,2,8:+float-layer``, ``5,2,8:int8+layer``. One
process loads the target once and builds a PlainGenerator and one SpecEngine per tree (the policy off). After one
untimed prompt through each, every prompt of ``--prompts`` (each set limited as ``eaglet bench --limit`` spreads it
over its kinds) runs through plain and every tree in a rotating order, so the machine's drift over minutes hits
every method alike (on the 2-core CPU plain decoding drifts by 20-30% over a run). One JSON line per prompt (tokens,
seconds, accept lengths per method) goes to ``--out``; a table last: accept length and spec / plain per set, tok/s,
outputs equal to plain's, and each tree's median per-prompt speed against the first tree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from eaglet.bench.methods import run_ours
from eaglet.bench.prompts import load_prompt_sets
from eaglet.chat import encode_chat
from eaglet.generate import PlainGenerator
from eaglet.loading import load_target
from eaglet.options import EngineOptions, SamplingParams, TargetOptions
from eaglet.speculative import SpecEngine
from eaglet.speculative.load import load_engine_draft, resolve_draft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--draft", default="default")
    ap.add_argument("--draft-vocab", type=int, default=None, help="default: the device's serving cut, as bench")
    ap.add_argument("--prompts", default="builtin,eaglet/data/corpus/other_prompts.jsonl")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--trees", nargs="+", default=["5,2,8", "6,2,10", "4,2,6"],
                    help="num_steps,topk,num_draft_tokens[:[int8|float][+layer|+float-layer]][@draft vocabulary]")
    ap.add_argument("--out", required=True, help="JSONL, one line per prompt")
    a = ap.parse_args()

    opts = TargetOptions.auto(a.target, a.device)
    target = load_target(opts.target, dtype=opts.torch_dtype, device=opts.device)
    prompts = load_prompt_sets(a.prompts, a.limit)
    ids = [encode_chat(target.tokenizer, p.messages) for p in prompts]
    prefill = EngineOptions(policy=False).fused_prefill(torch.device(a.device))
    path = resolve_draft(a.draft, target)
    gens = {"plain": PlainGenerator(target, opts.max_context, compile_prefill=prefill)}
    for tree in a.trees:
        shape, _, vocab = tree.partition("@")
        shape, _, head = shape.partition(":")
        head, _, layer = head.partition("+")
        steps, topk, nodes = map(int, shape.split(","))
        draft = load_engine_draft(path, target, int(vocab) if vocab else a.draft_vocab,
                                  {"int8": True, "float": False, "": None}[head],
                                  int8_layer={"layer": True, "float-layer": False, "": None}[layer])
        gens[tree] = SpecEngine(target, draft, opts.max_context, steps, topk, nodes, adaptive=False, compile=None,
                                compile_prefill=prefill, log=lambda m: print(m, file=sys.stderr))
    methods = list(gens)
    for m in methods:  # the first call of each builds its buffers
        run_ours(gens[m], ids[:1], SamplingParams(max_new_tokens=16), 1)
    params = SamplingParams(max_new_tokens=a.max_new_tokens)
    recs = []
    with open(a.out, "w") as out:
        for j, (p, prompt) in enumerate(zip(prompts, ids)):
            rec = {"i": j, "set": p.set, "category": p.category}
            for m in methods[j % len(methods):] + methods[:j % len(methods)]:
                r = run_ours(gens[m], [prompt], params, 1)[0]
                rec[m] = {"tokens": r.tokens, "s": r.seconds, "acc": r.accept_lengths}
            out.write(json.dumps(rec) + "\n")
            out.flush()
            recs.append(rec)
            print(f"{j + 1}/{len(prompts)} {time.strftime('%T')}", file=sys.stderr, flush=True)
    print_table(recs, methods)


def print_table(recs: list[dict], methods: list[str]) -> None:
    sets = sorted({r["set"] for r in recs})

    def rate(rs, m):
        return sum(len(r[m]["tokens"]) for r in rs) / sum(r[m]["s"] for r in rs)

    print(f"{'method':<18}" + "".join(f"{'accept ' + s[:8]:>17}{'x ' + s[:8]:>12}" for s in sets)
          + f"{'tok/s':>8}{'x all':>7}{'same':>7}{'vs ' + methods[1]:>12}")
    for m in methods:
        row = f"{m:<18}"
        for s in sets:
            rs = [r for r in recs if r["set"] == s]
            acc = [x for r in rs for x in r[m]["acc"]]
            row += f"{sum(acc) / len(acc):>17.2f}" if acc else f"{'-':>17}"
            row += f"{rate(rs, m) / rate(rs, 'plain'):>12.3f}"
        same = sum(r[m]["tokens"] == r["plain"]["tokens"] for r in recs)
        vs = statistics.median(r[methods[1]]["s"] / r[m]["s"] for r in recs)  # > 1: faster than the first tree
        print(row + f"{rate(recs, m):>8.1f}{rate(recs, m) / rate(recs, 'plain'):>7.3f}{same:>4}/{len(recs)}{vs:>12.3f}")


if __name__ == "__main__":
    main()
