"""What one speculative iteration costs against one plain step, per batch size and tree.

    PYTHONPATH=. python scripts/spec_step_costs.py --device cuda --batch 1 4 16 64

Random SmolLM2-shaped target and a random 32K-vocabulary draft (costs do not depend on the
values). After a real prefill of random prompts, each of the engine's three steps (grow,
verify with greedy acceptance, commit + draft extension with nothing committed) is
timed on its own with CUDA events, next to the plain decode step at the same batch size.
Prints one JSON line per batch size; the table in docs/speculative.md came from it.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch

from eaglet.capture import CaptureSpec
from eaglet.draft.model import DraftConfig, Eagle3Draft
from eaglet.sampling import SamplingParams, sample
from eaglet.spec import SpecEngine
from eaglet.spec.drafting import draft_prefill
from eaglet.spec.policy import default_ladder
from eaglet.spec.verify import prefill
from scripts.bench_decode import random_target


def cuda_ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--trees", type=int, default=2, help="how many trees of the default ladder to time")
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    target = random_target("smollm2-135m", torch.bfloat16, a.device)
    cfg = target.config
    draft = Eagle3Draft(DraftConfig.for_target(cfg, CaptureSpec.eagle3_default(cfg.num_layers), 32000))
    draft = draft.to(a.device, torch.bfloat16).eval().requires_grad_(False)
    draft.set_vocab(torch.arange(32000, device=a.device))
    greedy = SamplingParams()
    for b in a.batch:
        g = torch.Generator().manual_seed(b)
        lengths = torch.randint(200, 400, (b,), generator=g).tolist()
        prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in lengths]
        eng = SpecEngine(target, draft, 2048, adaptive=False, log=lambda _: None, compile=a.compile)
        tc, dc = eng._cache(b)
        logits, aux = prefill(target.model, tc, prompts, eng.capture)
        roots = sample(logits, greedy)
        seed = draft_prefill(draft, target.model.embed, dc, prompts, aux, roots)
        plain = cuda_ms(partial(eng._plain_step(tc), roots.view(-1, 1)))
        row = {"batch": b, "plain_step_ms": round(plain, 3)}
        for tree in default_ladder("cuda", b)[: a.trees]:
            st = eng._steps_for(tc, dc, tree, greedy)
            t = st.grow(seed, roots, None)
            path, n_path, _, aux2 = st.check(t)
            none = torch.zeros_like(n_path)
            ms = {"grow_ms": cuda_ms(partial(st.grow, seed, roots, None)), "verify_ms": cuda_ms(partial(st.check, t)),
                  "extend_ms": cuda_ms(partial(st.extend, aux2, path, none, path))}
            row[tree.describe()] = {**{k: round(v, 3) for k, v in ms.items()},
                                    "iteration_over_plain": round(sum(ms.values()) / plain, 2)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
