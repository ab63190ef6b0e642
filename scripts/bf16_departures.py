"""Where bf16 speculative output departs from bf16 plain output, and how close the call was.

    PYTHONPATH=. python scripts/bf16_departures.py [--prompts 12] [--tokens 96] [--device cpu]

Decodes the first N built-in bench prompts with SmolLM2 + its shipped draft in bf16, plain
and speculative (tree 5,2,8, fixed), and for each prompt whose outputs differ prints the
first differing position with the float32 model's top-2 logits there: a gap far below
bf16's rounding at that scale means a near-tie, not an engine bug.
"""

from __future__ import annotations

import argparse

import torch

from eaglet.bench.prompts import load_prompts
from eaglet.chat import encode_chat
from eaglet.generate import PlainGenerator, prefill
from eaglet.loading import load_target
from eaglet.sampling import SamplingParams
from eaglet.speculative import SpecEngine
from eaglet.speculative.load import default_draft_path, load_engine_draft


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    t16 = load_target("smollm2-135m", dtype=torch.bfloat16, device=a.device)
    t32 = load_target("smollm2-135m", device=a.device)
    draft = load_engine_draft(default_draft_path("smollm2-135m"), t16)
    prompts = [encode_chat(t16.tokenizer, p.messages) for p in load_prompts("builtin")[: a.prompts]]
    params = SamplingParams(max_new_tokens=a.tokens)
    spec = SpecEngine(t16, draft, 1024, 5, 2, 8, adaptive=False, log=lambda _m: None)
    plain = PlainGenerator(t16, 1024)
    same = 0
    for i, p in enumerate(prompts):
        x, y = plain.generate([p], params)[0].tokens, spec.generate([p], params)[0].tokens
        if x == y:
            same += 1
            continue
        k = next((j for j in range(min(len(x), len(y))) if x[j] != y[j]), min(len(x), len(y)))
        if k == min(len(x), len(y)):
            print(f"prompt {i}: one output is a prefix of the other ({len(x)} vs {len(y)} tokens)")
            continue
        logits = prefill(t32, t32.model.new_cache(1, len(p) + k + 1), [p + x[:k]])[0].float()
        top = logits.topk(2)
        print(f"prompt {i}: departs at answer token {k} (plain {x[k]}, spec {y[k]}); float32 top-2 "
              f"{top.indices.tolist()}, gap {float(top.values[0] - top.values[1]):.3f}")
    print(f"identical: {same}/{len(prompts)}")


if __name__ == "__main__":
    main()
