"""DeepSeek-V3 layer shapes on random weights: the decode step against its memory floor, and a tree's verify cost.

    PYTHONPATH=. python scripts/bench_deepseek.py --device cuda --batch 1 64 --out ds.jsonl   # H200, bf16
    PYTHONPATH=. python scripts/bench_deepseek.py --shape tiny --device cpu --batch 1 3         # smoke test

DeepSeek-V3's real dimensions (hidden 7168, 128 MLA heads, q/kv ranks 1536/512, 256 routed
experts of width 2048, 8 a token from 4 of 8 groups, one shared expert, vocabulary 129280)
with fewer layers: 1 dense + 3 MoE by default (~73 GB in bfloat16). Costs do not depend on
the values except through routing: a random router spreads tokens over the experts about
evenly, as a trained router balanced by its correction bias does.

Per batch size, with ``--context`` committed slots (their latents are zeros: attention costs
the same whatever they hold):
- the plain decode step (ms), as PlainGenerator runs it: static shapes, a CUDA graph on CUDA,
  torch.compile with ``--compile``;
- its floor: the bytes the step actually reads / measured copy bandwidth. That is every
  dense weight (attention, the dense MLP, routers, shared experts, the LM head), only the
  routed experts the step chose (counted per layer from its routing), the B embedding rows
  and the cache slots the static step attends over;
- the verify of a tree (``--tree``, default 6,8,48: 48 nodes, depth 6, 8 children a level):
  one target forward over every node plus the logits, in plain steps, with its own floor
  (B x 48 tokens choose many more experts than B).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from eaglet.generate import decode_step
from eaglet.loading.target import build_model
from eaglet.models.deepseek_config import DeepseekConfig, Yarn
from eaglet.models.moe import Experts, Router
from eaglet.speculative.tree import Tree, ancestor_mask
from eaglet.speculative.verify import verify

SHAPES = {
    "deepseek-v3": dict(model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                        num_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, n_shared_experts=1,
                        moe_intermediate_size=2048, num_experts_per_tok=8, n_group=8, topk_group=4,
                        routed_scaling_factor=2.5, max_position_embeddings=163840,
                        yarn=Yarn(40.0, 4096, mscale=1.0, mscale_all_dim=1.0)),
    "tiny": dict(model_type="deepseek_v3", vocab_size=384, hidden_size=64, intermediate_size=96, num_heads=4,
                 q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=24,
                 n_routed_experts=16, n_shared_experts=1, moe_intermediate_size=32, num_experts_per_tok=4,
                 n_group=4, topk_group=2, routed_scaling_factor=2.5, max_position_embeddings=4096),
}


def random_deepseek(shape: str, layers: int, dtype: torch.dtype, device: str, max_pos: int):
    cfg = DeepseekConfig(**SHAPES[shape], num_layers=layers, first_k_dense_replace=1)
    model = build_model(cfg, dtype, device, max_pos=max_pos)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("router.bias"):
                p.zero_()
            else:
                p.normal_(0, 0.02, generator=gen)
    return model


def synthetic_tree(batch: int, steps: int, topk: int, nodes: int, vocab: int, device) -> Tree:
    """A tree of ``nodes`` nodes: the root's ``topk`` children, then each level the first node's ``topk``
    children, down to depth ``steps`` (verify cost depends on the node count, not on the tokens)."""
    i = torch.arange(nodes, device=device)
    level = ((i - 1) // topk + 1).clamp(max=steps) * (i > 0)  # [N] depth
    first = 1 + topk * (level - 2).clamp(min=0)  # the first node of the level above
    parents = torch.where(level <= 1, 0, first).expand(batch, nodes).contiguous()  # [B, N]
    depth = level.expand(batch, nodes).contiguous()
    tokens = torch.randint(0, vocab, (batch, nodes), device=device)
    children = torch.full((batch, nodes, topk), -1, device=device)
    valid = torch.ones(batch, nodes, dtype=torch.bool, device=device)
    return Tree(tokens, parents, depth, ancestor_mask(parents, steps), valid, children, None)


def timed_ms(fn, cuda: bool, reps: int) -> float:
    if cuda:
        from scripts.spec_step_costs import cuda_ms

        return cuda_ms(fn, reps)
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def experts_chosen(model, fn) -> list[int]:
    """Distinct routed experts each MoE layer chooses in one eager run of ``fn``."""
    seen: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _a, out: seen.append(out[1].unique()))
             for m in model.modules() if isinstance(m, Router)]
    fn()
    for h in hooks:
        h.remove()
    return [int(s.numel()) for s in seen]


def bytes_read(model, tokens: int, chosen: list[int], slots: int, batch: int) -> int:
    """Weights and cache a forward of ``tokens`` tokens over ``slots`` cache slots per row reads."""
    elt = model.embed.weight.element_size()
    experts = [m for m in model.modules() if isinstance(m, Experts)]
    routed = {id(p) for m in experts for p in m.parameters()}
    dense = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                if id(p) not in routed and not n.startswith("embed."))
    per_expert = sum((m.gate_up[0].numel() + m.down[0].numel()) * elt for m in experts[:1])
    cfg = model.cfg
    cache = cfg.num_layers * batch * slots * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * elt
    return dense + sum(chosen) * per_expert + tokens * cfg.hidden_size * elt + cache


def copy_bandwidth(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    from scripts.bench_decode import copy_bandwidth as measure

    return measure(device)


def measure(model, b: int, a: argparse.Namespace, tree_shape: tuple[int, int, int], bw: float | None) -> dict:
    """One batch size: the plain step and the tree's verify, timed and set against their floors."""
    cuda = a.device.startswith("cuda")
    steps, topk, nodes = tree_shape
    capacity = a.context + nodes
    cache = model.new_cache(b, capacity)
    cache.lens.fill_(a.context)
    ids = torch.randint(0, model.cfg.vocab_size, (b, 1), device=a.device)
    eager = decode_step(model, cache, static=True)
    step_chosen = experts_chosen(model, lambda: eager(ids))
    step = decode_step(model, cache, static=True, compile=a.compile, graph=cuda)
    plain_ms = timed_ms(lambda: step(ids), cuda, a.reps)
    tree = synthetic_tree(b, steps, topk, nodes, model.cfg.vocab_size, a.device)

    def run_verify():
        return verify(model, cache, tree, (1, 2, 3), capacity)[0]

    verify_chosen = experts_chosen(model, run_verify)
    if cuda:
        from eaglet.cuda_graph import GraphedStep

        run_verify = GraphedStep(torch.compile(run_verify, dynamic=False) if a.compile else run_verify)
    verify_ms = timed_ms(run_verify, cuda, a.reps)
    row = {"shape": a.shape, "layers": a.layers, "device": a.device, "batch": b, "context": a.context,
           "compiled": a.compile, "plain_ms": plain_ms, "experts_per_layer": step_chosen,
           "plain_GB": bytes_read(model, b, step_chosen, capacity, b) / 1e9,
           "tree": a.tree, "verify_ms": verify_ms, "verify_in_plain_steps": verify_ms / plain_ms,
           "verify_experts_per_layer": verify_chosen,
           "verify_GB": bytes_read(model, b * nodes, verify_chosen, capacity, b) / 1e9}
    if bw:
        row.update(copy_TBps=bw / 1e12, plain_floor_ms=row["plain_GB"] * 1e12 / bw,
                   verify_floor_ms=row["verify_GB"] * 1e12 / bw)
        row.update(plain_x_floor=plain_ms / row["plain_floor_ms"], verify_x_floor=verify_ms / row["verify_floor_ms"])
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}


@torch.inference_mode()
def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="deepseek-v3", choices=list(SHAPES))
    ap.add_argument("--layers", type=int, default=4, help="1 dense + (layers - 1) MoE layers")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--context", type=int, default=1024, help="committed slots each row attends over")
    ap.add_argument("--tree", default="6,8,48", help="num_steps,topk,num_draft_tokens of the verified tree")
    ap.add_argument("--compile", action="store_true", help="torch.compile the steps (CUDA)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None, help="write the JSON lines here too")
    a = ap.parse_args(argv)
    cuda = a.device.startswith("cuda")
    steps, topk, nodes = map(int, a.tree.split(","))
    model = random_deepseek(a.shape, a.layers, torch.bfloat16 if cuda else torch.float32, a.device, a.context + nodes)
    bw = copy_bandwidth(a.device)
    rows = []
    for b in a.batch:
        rows.append(measure(model, b, a, (steps, topk, nodes), bw))
        print(json.dumps(rows[-1]), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
    return rows


if __name__ == "__main__":
    main()
