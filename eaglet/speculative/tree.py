"""The draft tree: EAGLE-2's dynamic tree (Li et al., arXiv 2406.16858) grown by an EAGLE-3 draft.

Growth. Step 0 reads the draft's output at the anchor (the last committed position)
and proposes ``topk`` children of the root (the pending token, not yet in the target's
cache). Each later step ``j`` runs the draft on the ``topk`` best depth-``j`` nodes (the
frontier) and proposes ``topk`` children for each. After ``num_steps`` steps the
``num_draft_tokens - 1`` best candidates by cumulative score, plus the root, go to
verification. Candidates live in a pool laid out depth by depth, siblings in proposal
order; selection is a stable sort, so a parent (score >= its child's, earlier in the
pool) always precedes its child and the chosen set is closed under ancestors, and the
chosen children of a node are always a prefix of its proposal order.

Scores. Greedy: children are the draft's top-k, scored by log-probability. Sampling:
children are a sample without replacement from the draft distribution ``q`` (Gumbel-top-k,
Kool et al. 2019) and scored by ``min(log q + Gumbel, 0)``: the perturbed key orders the
sample, its value is independent of which token it belongs to given the earlier
siblings, and clamping at 0 keeps cumulative scores non-increasing along a path. So
whether a sampled child is kept never depends on its own identity, which is what keeps
recursive rejection sampling (accept.py) lossless over a best-first tree; ranking by
the plain ``log q`` of sampled tokens would bias the output.

Draft attention at a node sees the committed draft cache plus its own ancestors: step
``j``'s frontier is written at draft slots ``lens + (j-1)*topk + i`` (scratch above the
committed slots) at rotary position ``anchor + j``. Every shape is static per (batch,
TreeConfig), so building a tree can be captured in one CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglet.kv_cache import AttnMeta, KVCache
from eaglet.options import TreeConfig
from eaglet.sampling import SamplingParams, probs
from eaglet.speculative import fused_top_k


@dataclass
class Tree:
    """One tree per batch row; node 0 is the root, nodes are in topological order."""

    tokens: torch.Tensor  # [B, N] target token ids
    parents: torch.Tensor  # [B, N] parent node (the root's is 0)
    depth: torch.Tensor  # [B, N] root = 0
    mask: torch.Tensor  # [B, N, N] node i sees node j iff j is i or an ancestor of i
    valid: torch.Tensor  # [B, N] False for filler nodes (zero draft probability): never accepted
    children: torch.Tensor  # [B, N, topk] child nodes in proposal order, -1 = none
    q: torch.Tensor | None  # [B, N, Vd] draft distribution each node's children were sampled from (sampling)


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """parents [B, N] (root's parent = itself, node 0) -> [B, N, N] self-or-ancestor mask.

    Node i's ancestors are its parent hops 0..max_depth (depth <= max_depth reaches the root); j is marked where
    one of them is j. Gathers and a comparison, which inductor fuses, rather than a scatter into the mask per
    hop (two kernels a hop)."""
    b, n = parents.shape
    hops = [torch.arange(n, device=parents.device).expand(b, n)]
    for _ in range(max_depth):
        hops.append(parents.gather(1, hops[-1]))
    anc = torch.stack(hops, -1)  # [B, N, D+1]
    return (anc.unsqueeze(2) == torch.arange(n, device=parents.device).view(1, 1, n, 1)).any(-1)


def gumbel(uniform: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(uniform.clamp(1e-20, 1.0 - 1e-7)))


# Chunk of the two-stage top-k on CUDA (``top_k``); a divisor of every draft vocabulary eaglet trains.
TOPK_CHUNK = 128
# Chunks of the two-stage argmax on CUDA (``argmax``), the largest dividing V first. Alone on an H100, the verify's
# argmax over 48 x 49,152 bf16 logits took 7.3 us in chunks of 128 and 5.9 in chunks of 1,024 (session 37,
# scripts/head_micro.py); SmolLM2's 6,8,48 iteration 1.413 -> 1.409 ms (session 38, scripts/h200/iteration_ab.sh).
# Llama 3's 128,256 take 256.
ARGMAX_CHUNKS = (1024, 512, 256, 128)


def argmax_chunk(v: int) -> int | None:
    """The largest of ARGMAX_CHUNKS dividing a vocabulary of ``v``, None where none does."""
    return next((c for c in ARGMAX_CHUNKS if v % c == 0), None)


def chunks(x: torch.Tensor, chunk: int | None, default: int | None = TOPK_CHUNK) -> int | None:
    """The chunk of a two-stage reduction over x's last dim (``top_k``, ``argmax``): ``chunk``, by default
    ``default`` on CUDA and none elsewhere; None (one stage) where it does not split V into at least four."""
    v = x.shape[-1]
    chunk = (default if x.device.type == "cuda" else None) if chunk is None else chunk
    return None if chunk is None or v % chunk or v < 4 * chunk else chunk


def top_k(x: torch.Tensor, k: int, chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., V] -> (values, indices) [..., k], largest first: what ``x.topk(k)`` gives (up to the order of
    ties), in fewer and cheaper kernels on CUDA.

    torch.topk over a few long rows takes its multi-block radix select, ~19 kernels a call: on the H200
    a 6,8,48 iteration over SmolLM2's 24,576-token draft vocabulary spent ~0.25 ms of its 1.80 ms in them
    (docs/performance.md, session 15). k = 1 is ``argmax``. Otherwise, with a chunk (``chunks``) dividing V:
    each chunk sorted, its best k kept, then those V/chunk*k candidates sorted and the best k kept, exact
    since every row's top k lies among its chunks' top k. Sorts, not torch.topk: topk over short slices
    still takes a radix select of many passes (17.5 us a call for 192 slices of 128 on the H200, session 16),
    where a sort of short slices is one small kernel (~4 us for 64-element slices there).
    """
    if k == 1:
        indices = argmax(x, chunk).unsqueeze(-1)
        return x.gather(-1, indices), indices
    v, chunk = x.shape[-1], chunks(x, chunk)
    if chunk is None or k > chunk:
        return x.topk(k, dim=-1)
    lead, n = x.shape[:-1], v // chunk
    part = x.reshape(*lead, n, chunk).sort(dim=-1, descending=True)  # each chunk in order
    start = torch.arange(0, v, chunk, device=x.device).unsqueeze(-1)  # [n, 1] each chunk's first index
    cand = (part.values[..., :k].reshape(*lead, n * k), (part.indices[..., :k] + start).reshape(*lead, n * k))
    values, best = cand[0].sort(dim=-1, descending=True)  # [..., n*k]
    return values[..., :k], cand[1].gather(-1, best[..., :k])


def argmax(x: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """x [..., V] -> each row's index of its largest value [...], the first of ties, as ``x.argmax(-1)``; on CUDA
    in chunks of ``argmax_chunk(V)`` (or of ``chunk``, dividing V) as two reductions: each chunk's max, then the
    first chunk holding the row's. One reduction over few long rows runs few programs: the verify's argmax of 5-48
    rows of 49,152 logits took 9.5-9.9 us in session 16's profile."""
    v = x.shape[-1]
    chunk = chunks(x, chunk, argmax_chunk(v))
    if chunk is None:
        return x.argmax(-1)
    part = x.unflatten(-1, (v // chunk, chunk)).max(-1)  # [..., V/chunk]: each chunk's max and its index
    best = part.values.argmax(-1, keepdim=True)  # [..., 1]
    return (part.indices.gather(-1, best) + best * chunk).squeeze(-1)


def best_first(scores: torch.Tensor, count: int) -> torch.Tensor:
    """scores [B, M] -> the indices [B, count] of the ``count`` best entries, ties to the lower index, in index
    order: a stable descending sort's first ``count`` indices, sorted, without the two sorts (on the H200 the
    stable sort of a 6,8,48 pool's 328 scores was one 17 us radix-sort launch, session 25). An entry is kept if
    fewer than ``count`` entries go before it (a higher score, or the same one at a lower index: [B, M, M]
    comparisons, one reduction), and lands at the number of kept entries before it."""
    b, m = scores.shape
    idx = torch.arange(m, device=scores.device)
    mine, theirs = scores.unsqueeze(2), scores.unsqueeze(1)  # [B, M, 1], [B, 1, M]
    ahead = (theirs > mine) | ((theirs == mine) & (idx.view(1, 1, m) < idx.view(1, m, 1)))  # [B, M, M]
    keep = ahead.sum(-1) < count  # [B, M]
    out = torch.zeros(b, count + 1, dtype=torch.long, device=scores.device)  # the last column takes the rest
    out.scatter_(1, torch.where(keep, keep.cumsum(1) - 1, count), idx.expand(b, m))
    return out[:, :count]


def propose(logits: torch.Tensor, k: int, params: SamplingParams, uniform: torch.Tensor | None):
    """Children of each row of draft logits [..., Vd] -> (draft ids, score increments, q or None).

    Greedy: top-k by log-probability. The log-softmax shifts each row by its log-sum-exp, so the
    top k of the logits are the same tokens, and only those k are shifted (the [..., Vd] float32
    log-probabilities are never written). With k = 1 the increments are 0: a chain verifies every
    node it grows (``TreeConfig``), so no score selects anything, and one argmax a step replaces the
    softmax's reductions. On CUDA the top k and the log-sum-exp come from one operator of two launches
    (``fused_top_k``).
    Sampling: k draws without replacement from q = probs(logits, params) via Gumbel-top-k on
    ``uniform`` [..., Vd]; increments are the perturbed keys clamped at 0 (-inf for draws outside
    q's support).
    """
    if params.greedy:
        if k == 1:
            ids = argmax(logits).unsqueeze(-1)
            return ids, torch.zeros(ids.shape, device=logits.device), None
        if fused_top_k.usable(logits, k):
            values, ids, lse = fused_top_k.top_k_lse(logits.reshape(-1, logits.shape[-1]), k)  # [R, k], [R]
            lead = logits.shape[:-1]
            return ids.view(*lead, k), (values - lse.unsqueeze(-1)).view(*lead, k), None
        values, ids = top_k(logits, k)
        return ids, values.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True), None
    q = probs(logits, params)  # [..., Vd] float32
    keys, ids = top_k(torch.log(q) + gumbel(uniform), k)
    return ids, keys.clamp(max=0.0), q


def build_tree(draft, embed, seed: torch.Tensor, roots: torch.Tensor, cache: KVCache, cfg: TreeConfig,
               params: SamplingParams, uniform: torch.Tensor | None = None, n_slots: int | None = None) -> Tree:
    """Grow one tree per row from the draft's pre-norm output at the anchor.

    seed [B, H]: draft output at the last committed anchor; roots [B]: the pending tokens;
    cache: the draft's cache (``lens`` = committed anchors); uniform [B, noise_rows, Vd]
    (sampling only): the randomness, drawn by the caller so this function can be graphed.
    """
    grow = grow_chain if cfg.topk == 1 else grow_tree
    return grow(draft, embed, seed, roots, cache, cfg, params, uniform, n_slots)


def grow_chain(draft, embed, seed: torch.Tensor, roots: torch.Tensor, cache: KVCache, cfg: TreeConfig,
               params: SamplingParams, uniform: torch.Tensor | None = None, n_slots: int | None = None) -> Tree:
    """``grow_tree``'s tree for topk = 1, a chain, in fewer kernels. Each step's one node is the next step's
    frontier and every node is verified (``TreeConfig``: num_draft_tokens = num_steps + 1), so nothing is
    scored, sorted or selected, and the structure (parents, depth, mask, children) is the same every
    iteration: only the tokens (and, sampling, the q each child was drawn from) are grown. In session 16's
    profile of the 4,1,5 iteration, selection, masks and the frontier's gathers were many of its small kernels."""
    steps, b, dev = cfg.num_steps, seed.shape[0], seed.device
    n, max_pos = steps + 1, draft.rotary.cos.shape[0] - 1
    ids, _, q = propose(draft.logits(seed), 1, params, None if uniform is None else uniform[:, 0])  # [B, 1]
    tokens, qs = [roots.view(-1, 1), draft.to_target_ids(ids)], [q]
    out, lens = seed.unsqueeze(1), cache.lens.view(-1, 1)  # [B, 1, H], [B, 1]
    scratch = torch.arange(cfg.region, device=dev).view(1, 1, -1)  # [1, 1, R]: step j's node sits at slot j - 1
    for j in range(1, steps):
        vis = (scratch < j).expand(b, 1, cfg.region)  # the chain so far: the node's ancestors and itself
        meta = AttnMeta((lens - 1 + j).clamp(max=max_pos), lens + (j - 1), lens=cache.lens, extra=vis,
                        n_slots=n_slots)
        out = draft(out, embed(tokens[-1]), meta, cache)  # [B, 1, H]
        ids, _, q = propose(draft.logits(out), 1, params, None if uniform is None else uniform[:, j:j + 1])
        tokens.append(draft.to_target_ids(ids).view(b, 1))
        qs.append(q)
    node = torch.arange(n, device=dev)
    q = None
    if not params.greedy:  # node i's children were drawn from qs[i]; the last node was not expanded
        q = torch.cat([qs[0].unsqueeze(1), *qs[1:], torch.zeros_like(qs[0]).unsqueeze(1)], 1)  # [B, N, Vd]
    return Tree(tokens=torch.cat(tokens, 1), parents=(node - 1).clamp(min=0).expand(b, n), depth=node.expand(b, n),
                mask=(node.view(-1, 1) >= node).expand(b, n, n), valid=torch.ones(b, n, dtype=torch.bool, device=dev),
                children=torch.where(node < n - 1, node + 1, -1).view(1, n, 1).expand(b, n, 1), q=q)


def grow_tree(draft, embed, seed: torch.Tensor, roots: torch.Tensor, cache: KVCache, cfg: TreeConfig,
              params: SamplingParams, uniform: torch.Tensor | None = None, n_slots: int | None = None) -> Tree:
    """``build_tree`` for any tree (best-first selection of the grown pool)."""
    k, steps, n = cfg.topk, cfg.num_steps, cfg.num_draft_tokens
    b, dev = seed.shape[0], seed.device
    rows = torch.arange(b, device=dev).view(-1, 1)
    max_pos = draft.rotary.cos.shape[0] - 1

    # The pool: entry 0 is the root, then depth 1 (k entries), then k*k per later depth.
    ids, inc, q0 = propose(draft.logits(seed), k, params, None if uniform is None else uniform[:, 0])
    tokens = [roots.view(-1, 1), draft.to_target_ids(ids)]  # [B, 1], [B, k]
    scores = [torch.zeros(b, 1, device=dev), inc]
    parent = [torch.zeros(b, 1 + k, dtype=torch.long, device=dev)]
    depth = [torch.zeros(b, 1, dtype=torch.long, device=dev), torch.ones(b, k, dtype=torch.long, device=dev)]
    rank = [torch.zeros(b, 1, dtype=torch.long, device=dev), torch.arange(k, device=dev).expand(b, k)]
    expanded, qs = [torch.zeros(b, 1, dtype=torch.long, device=dev)], [q0]  # pool ids with their child q

    front = torch.arange(1, 1 + k, device=dev).expand(b, k)  # [B, k] pool ids of the frontier
    front_tok, front_score, front_in = tokens[1], inc, seed.unsqueeze(1).expand(b, k, -1)
    vis = torch.zeros(b, k, cfg.region, dtype=torch.bool, device=dev)  # [B, k, R]
    scratch = torch.arange(cfg.region, device=dev)  # [R]; a pointwise OR, not a scatter, marks each node's own slot
    lens = cache.lens.view(-1, 1)
    base = 1 + k
    for j in range(1, steps):
        off = (j - 1) * k
        vis = vis | (scratch == off + torch.arange(k, device=dev).view(1, k, 1))  # each frontier node sees itself
        slots = lens + off + torch.arange(k, device=dev)  # [B, k]
        pos = (lens - 1 + j).clamp(max=max_pos).expand(b, k)
        meta = AttnMeta(pos, slots, lens=cache.lens, extra=vis, n_slots=n_slots)  # sees committed + ancestors
        out = draft(front_in, embed(front_tok), meta, cache)  # [B, k, H]
        u = None if uniform is None else uniform[:, 1 + off: 1 + off + k]
        ids, inc, q = propose(draft.logits(out), k, params, u)  # [B, k, k]
        expanded.append(front)
        qs.append(q)
        cand_tok = draft.to_target_ids(ids).reshape(b, k * k)
        cand_score = (front_score.unsqueeze(-1) + inc).reshape(b, k * k)
        tokens.append(cand_tok)
        scores.append(cand_score)
        parent.append(front.repeat_interleave(k, dim=1))
        depth.append(torch.full((b, k * k), j + 1, dtype=torch.long, device=dev))
        rank.append(torch.arange(k, device=dev).repeat(k).expand(b, k * k))
        best = torch.sort(cand_score, dim=1, descending=True, stable=True).indices[:, :k]  # [B, k]
        via = best // k  # which frontier node each new frontier node came from
        front = base + best
        front_tok, front_score = cand_tok.gather(1, best), cand_score.gather(1, best)
        front_in = out[rows, via]  # [B, k, H]
        vis = vis[rows, via]  # [B, k, R]: the parent's ancestors (and the parent)
        base += k * k

    tokens, scores = torch.cat(tokens, 1), torch.cat(scores, 1)  # [B, M+1]
    parent, depth, rank = torch.cat(parent, 1), torch.cat(depth, 1), torch.cat(rank, 1)
    # Best-first selection (ties go to the shallower, earlier entry), in pool order.
    chosen = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=dev), best_first(scores[:, 1:], n - 1) + 1], 1)
    node_of = torch.full_like(tokens, n)  # pool id -> node index, n = not chosen
    node_of.scatter_(1, chosen, torch.arange(n, device=dev).expand(b, n))
    parents = node_of.gather(1, parent.gather(1, chosen))  # [B, N]
    node_depth = depth.gather(1, chosen)
    children = torch.full((b, n * k + 1), -1, dtype=torch.long, device=dev)  # last column: the root's dump
    flat = torch.where(node_depth > 0, parents * k + rank.gather(1, chosen), n * k)
    children.scatter_(1, flat, torch.arange(n, device=dev).expand(b, n))
    q = None
    if not params.greedy:
        exp_ids, exp_q = torch.cat(expanded, 1), torch.cat([qs[0].unsqueeze(1), *qs[1:]], 1)  # [B, E], [B, E, Vd]
        q = torch.zeros(b, n + 1, exp_q.shape[-1], device=dev)
        q[rows, node_of.gather(1, exp_ids)] = exp_q  # unchosen expanded nodes land in row n
        q = q[:, :n]
    return Tree(tokens=tokens.gather(1, chosen), parents=parents, depth=node_depth,
                mask=ancestor_mask(parents, steps), valid=scores.gather(1, chosen) > float("-inf"),
                children=children[:, : n * k].view(b, n, k), q=q)
