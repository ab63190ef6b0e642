"""What one speculative iteration costs against one plain step, per batch size and tree, by phase.

    PYTHONPATH=. python scripts/spec_step_costs.py --device cuda --batch 1 --trees 4,1,5 6,8,48

Random target of a named shape and a random draft of matching shape (costs do not depend
on the values). After a real prefill of random prompts, it times (CUDA events, mean of
replays after warm-up; every row inactive, so nothing is committed):
- the plain decode step (compiled and graphed, as PlainGenerator runs it);
- per tree, the engine's whole iteration as one graph, and graphs of its prefixes (draft
  growth; growth + verify + greedy acceptance), whose differences give the phases;
- the whole call as the engine makes it (replay, pinned copy, synchronisation): the host gap.
Prints one JSON line per (batch, tree) and a table last.

``--dynamic`` compiles with torch's automatic dynamic shapes instead of one static compile per batch
size: the first batch size compiles static, the second marks the sizes that changed (the batch)
symbolic, and later batch sizes reuse that compile (only the CUDA graph is captured per size). An
experiment: compile seconds and step costs per batch against the default, each mode in its own
process with its own TORCHINDUCTOR_CACHE_DIR (the persistent cache would hide a cold compile).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import eaglet.models.int8_matmul as int8_matmul
import eaglet.models.layers as layers
import eaglet.speculative.tree as tree_module
from eaglet.cuda_graph import GraphedStep, compiled
from eaglet.models.int8_matmul import CudaInt8Linear
from eaglet.sampling import SamplingParams, sample
from eaglet.speculative import SpecEngine
from eaglet.speculative.accept import greedy_accept
from eaglet.speculative.drafting import draft_prefill
from eaglet.speculative.policy import default_ladder
from eaglet.speculative.tree import TreeConfig, build_tree
from eaglet.speculative.verify import prefill, verify
from scripts.bench_decode import random_draft, random_target


def cuda_ms(fn, reps: int = 30) -> float:
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


def kernel_profile(fn, label: str, top: int, reps: int = 10) -> dict:
    """Kernels of ``reps`` replays of ``fn`` (CUPTI sees the kernels inside a CUDA graph): how many a replay
    launches, their summed GPU time against the replay's wall time (the rest is gaps between kernels), and
    the ``top`` kernels by GPU time, printed as a table."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        print(f"\n-- {label}: the profiler saw no kernels")
        return {}
    busy_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / reps
    span_ms = (max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)) / 1e3 / reps
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.time_range.elapsed_us() / 1e3 / reps)
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    print(f"\n-- {label}: {len(kernels) / reps:.0f} kernels a replay, {busy_ms:.3f} ms busy of {span_ms:.3f} ms")
    for name, times in ranked[:top]:
        print(f"{sum(times):8.4f} ms {len(times) / reps:6.1f}x  {name[:110]}")
    return {"kernels": len(kernels) / reps, "busy_ms": busy_ms, "span_ms": span_ms}


def prefix_graph(eng: SpecEngine, batch: int, cfg: TreeConfig, upto: str) -> GraphedStep:
    """The iteration up to ``upto`` ('grow' or 'verify'), compiled and graphed; touches scratch slots only."""
    tc, dc, state = eng._caches[batch]
    model, draft, greedy = eng.target.model, eng.draft, SamplingParams()

    def run():
        tree = build_tree(draft, model.embed, state.seed, state.roots, dc, cfg, greedy, None, dc.capacity)
        if upto == "grow":
            return tree.tokens
        logits, _ = verify(model, tc, tree, eng.capture, tc.capacity)
        return greedy_accept(tree, logits.argmax(-1), cfg.num_steps + 1).n_path

    return GraphedStep(torch.compile(run, dynamic=False))


def triton_gemms(target, min_rows: int) -> None:
    """Route the target's bias-free GEMMs of at least ``min_rows`` rows (every module calls ``layers.dense``)
    through the int8 kernel given the bf16 weight itself: its widening a no-op, its scales ones (one tensor a
    width, made here so that the compiled step reads them as constants). The draft's ``layers.Linear`` modules
    of a target's width follow too where their rows reach ``min_rows``: its prefill only (a tree's draft steps
    run at most 8 rows at batch 1), and none once they are int8."""
    ones = {w.shape[0]: torch.ones(w.shape[0], device=w.device) for w in target.parameters() if w.dim() == 2}
    base = layers.dense

    def dense(x, weight, bias=None):
        rows = x.reshape(-1, x.shape[-1])
        if bias is None and x.is_cuda and rows.shape[0] >= min_rows and weight.shape[0] in ones:
            y = torch.ops.eaglet.int8_matmul(rows, weight, ones[weight.shape[0]])
            return y.view(*x.shape[:-1], weight.shape[0])
        return base(x, weight, bias)

    layers.dense = dense


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="smollm2-135m", help="a shape of scripts/bench_decode.py")
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--trees", nargs="+", default=["4,1,5", "6,8,48"],
                    help="num_steps,topk,num_draft_tokens each, or 'default' (the batch size's automatic tree)")
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--draft-intermediate-size", type=int, default=None,
                    help="the draft's MLP width (default: the target layer's, as EAGLE-3's draft)")
    ap.add_argument("--context", type=int, default=300, help="committed tokens before timing")
    ap.add_argument("--phases", action="store_true", help="also time the iteration's prefixes (two more compiles)")
    ap.add_argument("--out", default=None, help="append the JSON lines to this file too")
    ap.add_argument("--dynamic", action="store_true", help="automatic dynamic shapes (see above)")
    ap.add_argument("--int8-draft-head", action="store_true", help="the draft's LM head in int8 (CudaInt8Linear)")
    ap.add_argument("--int8-draft-layer", action="store_true",
                    help="the draft's fc and layer projections in int8 too (Eagle3Draft.int8_projections)")
    ap.add_argument("--argmax-chunk", type=int, default=None,
                    help="the two-stage argmax's chunk (default: eaglet.speculative.tree.argmax_chunk's choice)")
    ap.add_argument("--int8-tile", type=json.loads, default={}, metavar="JSON",
                    help="overrides of int8_matmul.CONFIG, the int8 kernel's tile (int8_layer_micro.py --best-out)")
    ap.add_argument("--triton-gemm-rows", type=int, default=0, metavar="R",
                    help="an experiment: the target's GEMMs of at least R rows (verify's, not a batch-1 plain step's) "
                         "through eaglet::int8_matmul's kernel over the bf16 weight (scales of one)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile the plain step and each iteration: kernel count, busy time, the N costliest")
    a = ap.parse_args()
    int8_matmul.CONFIG.update(a.int8_tile)  # read at each launch, so before anything compiles
    if a.argmax_chunk:
        tree_module.ARGMAX_CHUNKS = (a.argmax_chunk,)  # read when the iteration is traced
    if a.dynamic:
        import eaglet.generate
        import eaglet.speculative.engine

        def automatic(fn, what, **options):
            return compiled(fn, what, **{**options, "dynamic": None})

        eaglet.generate.compiled = eaglet.speculative.engine.compiled = automatic
    target = random_target(a.shape, torch.bfloat16, a.device)
    cfg = target.config
    if a.triton_gemm_rows:
        triton_gemms(target, a.triton_gemm_rows)
    draft = random_draft(target, a.draft_vocab, a.draft_intermediate_size)
    if a.int8_draft_head:
        draft.lm_head = CudaInt8Linear(draft.lm_head.weight)
    if a.int8_draft_layer:
        draft.int8_projections(CudaInt8Linear)  # random_draft's is fused already
    greedy = SamplingParams()
    rows = []
    for b in a.batch:
        g = torch.Generator().manual_seed(b)
        prompts = [torch.randint(0, cfg.vocab_size, (a.context,), generator=g).tolist() for _ in range(b)]
        trees = [default_ladder("cuda", b)[0] if t == "default" else TreeConfig(*map(int, t.split(",")))
                 for t in a.trees]
        eng = SpecEngine(target, draft, 2048, adaptive=False, log=lambda _: None)
        eng.policy.ladder(b)
        eng.policy._ladders[b] = trees  # the cache margin must cover every tree timed
        tc, dc, state = eng._cache(b)
        logits, aux = prefill(target.model, tc, prompts, eng.capture)
        roots = sample(logits, greedy)
        state.seed.copy_(draft_prefill(draft, target.model.embed, dc, prompts, aux, roots))
        state.roots.copy_(roots)
        t0 = time.perf_counter()
        step = eng._plain_step(tc)
        plain_compile = time.perf_counter() - t0
        plain = cuda_ms(lambda: step(state.roots.view(-1, 1)))  # noqa: B023 (called at once)
        plain_prof = kernel_profile(lambda: step(state.roots.view(-1, 1)), f"plain, batch {b}",  # noqa: B023
                                    a.profile) if a.profile else {}
        for tree in trees:
            t0 = time.perf_counter()
            it = eng._iteration(b, tree, greedy)
            compile_s = time.perf_counter() - t0
            with state.idle():
                full = cuda_ms(it._run)
            # A median of 30: the engine's 3 (enough to rank trees) put the host's share of a 4,1,5 call at
            # 0.52 ms in session 16, 0.085 in session 15.
            call = eng._measure(lambda: it(None), state, reps=30) * 1e3  # noqa: B023 (called at once)
            row = {"shape": a.shape, "dynamic": a.dynamic, "batch": b, "tree": tree.describe(),
                   "draft_head": "int8" if a.int8_draft_head else "bf16",
                   "draft_layer": "int8" if a.int8_draft_layer else "bf16",
                   "draft_vocab": a.draft_vocab, "draft_mlp": draft.config.intermediate_size,
                   "argmax_chunk": a.argmax_chunk or "default", "triton_gemm_rows": a.triton_gemm_rows,
                   "int8_tile": int8_matmul.CONFIG if a.int8_draft_head or a.int8_draft_layer else None,
                   "plain_ms": plain,
                   "plain_compile_s": plain_compile, "iteration_compile_s": compile_s, "iteration_ms": full,
                   "call_ms": call, "host_ms": call - full}
            if a.profile:
                with state.idle():
                    prof = kernel_profile(it._run, f"{tree.describe()}, batch {b}", a.profile)
                row.update({f"plain_{k}": v for k, v in plain_prof.items()})
                row.update({f"iteration_{k}": v for k, v in prof.items()})
            if a.phases:
                grow = cuda_ms(prefix_graph(eng, b, tree, "grow"))
                upto_verify = cuda_ms(prefix_graph(eng, b, tree, "verify"))
                row.update(draft_ms=grow, verify_accept_ms=upto_verify - grow, commit_extend_ms=full - upto_verify)
            row = {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
            rows.append(row)
            line = json.dumps(row)
            print(line, flush=True)
            if a.out:  # each row as soon as it exists, appended: a run stopped at its time limit keeps what it
                with open(a.out, "a") as f:  # measured, and runs into one file (one shape each) keep theirs
                    f.write(line + "\n")
    print(f"\n{'batch':>5} {'tree':>34} {'plain':>7} {'iter':>7} {'call':>7} {'draft':>7} {'verify':>7} "
          f"{'commit':>7} {'call/plain':>10} {'compile s':>9}")
    for r in rows:
        ph = [r.get(k, float("nan")) for k in ("draft_ms", "verify_accept_ms", "commit_extend_ms")]
        print(f"{r['batch']:>5} {r['tree']:>34} {r['plain_ms']:7.3f} {r['iteration_ms']:7.3f} {r['call_ms']:7.3f} "
              f"{ph[0]:7.3f} {ph[1]:7.3f} {ph[2]:7.3f} {r['call_ms'] / r['plain_ms']:10.2f} "
              f"{r['iteration_compile_s']:9.1f}")


if __name__ == "__main__":
    main()
