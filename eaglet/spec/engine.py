"""Speculative decoding with an EAGLE-3 draft: grow a tree, verify it in one pass, accept, commit.

One iteration, per batch (every row has its own tree, acceptance and lengths):

1. tree.py grows a tree from the draft output at the last anchor (root = pending token);
2. verify.py runs the target once over all nodes, capturing the draft's points;
3. accept.py keeps a path (greedy, or recursive rejection sampling) and picks the next token;
4. the accepted tokens are emitted, with EOS, stop strings and limits applied per row;
5. drafting.py commits the path in the target cache and extends the draft cache.

GPU: steps 1, 2 (+ greedy acceptance) and 5 each replay a CUDA graph captured per
(batch, tree, greedy) over the whole cache (static shapes, ``n_slots = capacity``);
each is captured with inputs that only touch scratch slots above ``lens``. CPU: the
same functions run eagerly and attend only over the slots in use. policy.py decides the
tree per batch size and falls back to plain decoding when speculation would be slower.

Tensor parallelism: the target is sharded, the draft replicated, and every rank runs this
same loop. Rank 0 decides and the others follow, through ``broadcast_from_rank0``: the
sampled root tokens, the tree each verify checks (so the sharded target's forward sees
the same input on every rank, however the replicated draft rounds or samples), the
accepted path with its length and next token, and the policy's timing-based switches.
Everything else is a function of those and of all-reduced target outputs, so the caches,
stops and outputs agree on every rank, seeded or not.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch

from eaglet.errors import EagletError
from eaglet.generate import Completion, StopChecker, context_size, decode_step
from eaglet.loading.target import Target
from eaglet.parallel.state import TPGroup, broadcast_from_rank0
from eaglet.sampling import SamplingParams, sample
from eaglet.spec.accept import Acceptance, greedy_accept, sample_accept
from eaglet.spec.drafting import commit_and_extend, draft_prefill
from eaglet.spec.policy import BatchPolicy
from eaglet.spec.tree import Tree, TreeConfig, build_tree
from eaglet.spec.verify import prefill, verify


def _stderr(msg: str) -> None:
    print(f"eaglet: {msg}", file=sys.stderr)


def _quiet(_msg: str) -> None:
    pass


def share_tree(tree: Tree, tp: TPGroup) -> Tree:
    """Rank 0's tree (what the target verifies and acceptance reads) on every rank; one broadcast.

    ``children`` and ``q`` stay local: only rank 0's rejection sampling reads them.
    """
    if tp.size == 1:
        return tree
    b, n = tree.tokens.shape
    buf = torch.cat([tree.tokens, tree.parents, tree.depth, tree.valid.long(), tree.mask.reshape(b, n * n).long()],
                    dim=1)  # [B, 4N + N*N]
    broadcast_from_rank0(buf, tp)
    if tp.rank == 0:
        return tree
    tokens, parents, depth, valid, mask = buf.split([n, n, n, n, n * n], dim=1)
    return Tree(tokens, parents, depth, mask.reshape(b, n, n).bool(), valid.bool(), tree.children, tree.q)


def share_acceptance(acc: Acceptance, tp: TPGroup) -> Acceptance:
    """Rank 0's accepted path, accept lengths and next tokens on every rank; one broadcast."""
    if tp.size == 1:
        return acc
    w = acc.path.shape[1]
    buf = torch.cat([acc.path, acc.n_path.view(-1, 1), acc.next_token.view(-1, 1)], dim=1)  # [B, W+2]
    broadcast_from_rank0(buf, tp)
    return Acceptance(buf[:, :w], buf[:, w], buf[:, w + 1])


class _Rows:
    """Per-row output: limits, stop handling and streaming for appends of several tokens."""

    def __init__(self, prompts, params: SamplingParams, capacity: int, stops: StopChecker, on_token):
        self.out = [Completion([], "length") for _ in prompts]
        self.done = [False] * len(prompts)
        self.limit = [min(params.max_new_tokens, capacity - len(p)) for p in prompts]
        self.stops, self.on_token = stops, on_token

    def add(self, i: int, new: list[int]) -> None:
        c = self.out[i]
        before = len(c.tokens)
        new = new[: self.limit[i] - before]
        c.tokens.extend(new)
        keep = self.stops.check(c.tokens, len(new)) if new else None
        if keep is not None:
            del c.tokens[keep:]
            c.finish_reason, self.done[i] = "stop", True
        elif len(c.tokens) >= self.limit[i]:
            self.done[i] = True
        if self.on_token:
            for t in c.tokens[before:]:
                self.on_token(i, t)


class _Steps:
    """The three per-iteration functions for one (batch, tree, greedy), graphed on CUDA."""

    def __init__(self, eng: SpecEngine, tcache, dcache, cfg: TreeConfig, params: SamplingParams):
        self.cfg, self.params = cfg, params
        model, draft, embed, capture = eng.target.model, eng.draft, eng.target.model.embed, eng.capture
        t_slots, d_slots = (tcache.capacity, dcache.capacity) if eng.static_shapes else (None, None)
        width = cfg.num_steps + 1

        def grow(seed, roots, uniform=None) -> Tree:
            return build_tree(draft, embed, seed, roots, dcache, cfg, params, uniform, d_slots)

        def check(tokens, parents, depth, mask, valid):
            tree = Tree(tokens, parents, depth, mask, valid, None, None)
            logits, aux = verify(model, tcache, tree, capture, t_slots)
            if not params.greedy:
                return logits, aux
            acc = greedy_accept(tree, logits.argmax(-1), width)
            return acc.path, acc.n_path, acc.next_token, aux

        def extend(aux, path, n_commit, anchor_tokens):
            return commit_and_extend(draft, embed, tcache, dcache, aux, path, n_commit, anchor_tokens, d_slots)

        if eng.compile:  # fusion before capture; graph breaks are allowed (tree bookkeeping)
            grow, check, extend = (torch.compile(f, dynamic=False) for f in (grow, check, extend))
        self._grow, self._check, self._extend = grow, check, extend
        if eng.use_graphs:
            from eaglet.cuda_graph import GraphedStep

            b, n, dev = tcache.batch, cfg.num_draft_tokens, tcache.lens.device
            h = eng.draft.config.hidden_size

            def zl(*shape):  # dummy index inputs: they make the capture touch only scratch slots
                return torch.zeros(*shape, dtype=torch.long, device=dev)

            dtype = model.embed.weight.dtype
            grow_in = [torch.zeros(b, h, dtype=dtype, device=dev), zl(b)]
            if not params.greedy:
                grow_in.append(torch.full((b, cfg.noise_rows, draft.config.draft_vocab_size), 0.5, device=dev))
            self._grow = GraphedStep(grow, *grow_in)
            eye = torch.eye(n, dtype=torch.bool, device=dev).expand(b, n, n)
            self._check = GraphedStep(check, zl(b, n), zl(b, n), zl(b, n), eye,
                                      torch.ones(b, n, dtype=torch.bool, device=dev))
            aux_w = eng.draft.config.capture.k * model.cfg.hidden_size
            self._extend = GraphedStep(extend, torch.zeros(b, n, aux_w, dtype=dtype, device=dev),
                                       zl(b, width), zl(b), zl(b, width))

    def grow(self, seed, roots, uniform) -> Tree:
        return self._grow(seed, roots) if uniform is None else self._grow(seed, roots, uniform)

    def check(self, tree: Tree):
        return self._check(tree.tokens, tree.parents, tree.depth, tree.mask, tree.valid)

    def extend(self, aux, path, n_commit, anchor_tokens):
        return self._extend(aux, path, n_commit, anchor_tokens)


class SpecEngine:
    """Target + EAGLE-3 draft. ``generate`` has PlainGenerator's interface and output."""

    def __init__(self, target: Target, draft, max_context: int | None = None, num_steps: int | None = None,
                 topk: int | None = None, num_draft_tokens: int | None = None, use_graphs: bool | None = None,
                 adaptive: bool = True, log: Callable[[str], None] = _stderr, static_shapes: bool | None = None,
                 compile: bool | None = None):
        given = {"--num-steps": num_steps, "--topk": topk, "--num-draft-tokens": num_draft_tokens}
        if any(v is not None for v in given.values()) and any(v is None for v in given.values()):
            missing = ", ".join(k for k, v in given.items() if v is None)
            raise EagletError(f"set all of --num-steps, --topk and --num-draft-tokens, or none of them "
                              f"(automatic); missing: {missing}")
        fixed = TreeConfig(num_steps, topk, num_draft_tokens) if num_steps is not None else None
        c, tc = draft.config, target.config
        if c.vocab_size != tc.vocab_size or c.capture.num_layers != tc.num_layers or c.target_hidden != tc.hidden_size:
            raise EagletError(f"the draft was built for a target with vocabulary {c.vocab_size}, "
                              f"{c.capture.num_layers} layers and hidden size {c.target_hidden}; this target has "
                              f"{tc.vocab_size}, {tc.num_layers} and {tc.hidden_size}")
        if fixed and fixed.topk > c.draft_vocab_size:
            raise EagletError(f"topk={fixed.topk} exceeds the draft vocabulary ({c.draft_vocab_size} tokens)")
        self.tp = target.model.tp
        log = log if self.tp.rank == 0 else _quiet  # rank 0 speaks for all ranks
        self.target, self.draft, self.log = target, draft, log
        self.capture = c.capture.points
        self.capacity = context_size(target, max_context)
        self.device = target.model.embed.weight.device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        # Graphs need every step to attend over the whole cache; without them that is only a test mode.
        self.static_shapes = self.use_graphs or bool(static_shapes)
        # Off by default: max-autotune took over 6 minutes for one batch size's three steps on
        # an H200 without finishing; plain compile mode is not measured yet (see docs/speculative.md).
        self.compile = bool(compile)
        self.policy = BatchPolicy(self.device.type, fixed, adaptive, log, agree=self._rank0_says)
        self._caches: dict[int, tuple] = {}
        self._steps: dict[tuple, _Steps] = {}
        self._plain: dict[int, Callable] = {}
        self._draft_to_target = draft.to_target_ids(torch.arange(c.draft_vocab_size, device=self.device))

    def _rank0_says(self, flag: bool) -> bool:
        """Rank 0's value of a per-rank decision (the policy's, from per-rank timings)."""
        if self.tp.size == 1:
            return flag
        return bool(broadcast_from_rank0(torch.tensor([flag], device=self.device), self.tp).item())

    def _sample(self, logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> torch.Tensor:
        """Tokens [B] sampled on rank 0 and shared: every rank continues with the same ones."""
        return broadcast_from_rank0(sample(logits, params, gen), self.tp)

    def _margin(self, batch: int) -> int:
        return max(max(t.num_draft_tokens, t.region, t.num_steps + 1) for t in self.policy.ladder(batch))

    def _cache(self, batch: int):
        if batch not in self._caches:
            cap = self.capacity + self._margin(batch)
            self._caches[batch] = (self.target.model.new_cache(batch, cap), self.draft.new_cache(batch, cap))
        tcache, dcache = self._caches[batch]
        tcache.reset()
        dcache.reset()
        return tcache, dcache

    def _steps_for(self, tcache, dcache, cfg: TreeConfig, params: SamplingParams) -> _Steps:
        key = (tcache.batch, cfg, None if params.greedy else (params.temperature, params.top_k, params.top_p))
        if key not in self._steps:
            self._steps[key] = _Steps(self, tcache, dcache, cfg, params)
        return self._steps[key]

    def _plain_step(self, tcache) -> Callable[[torch.Tensor], torch.Tensor]:
        """PlainGenerator's step (compiled and graphed on CUDA): the fallback and the yardstick."""
        b = tcache.batch
        if b not in self._plain:
            self._plain[b] = decode_step(self.target.model, tcache, self.static_shapes,
                                         compile=self.use_graphs, graph=self.use_graphs)
        return self._plain[b]

    def _time_plain(self, tcache, roots: torch.Tensor) -> float:
        step, times = self._plain_step(tcache), []
        for _ in range(4):
            t0 = time.perf_counter()
            step(roots.view(-1, 1)).argmax(-1).tolist()
            times.append(time.perf_counter() - t0)
        return sorted(times[1:])[1]

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 on_token: Callable[[int, int], None] | None = None) -> list[Completion]:
        """Decode each prompt; ``on_token(row, token)`` streams tokens as they are final."""
        for p in prompts:
            if len(p) + 1 > self.capacity:
                raise EagletError(f"the prompt has {len(p)} tokens but the context holds {self.capacity}; "
                                  "shorten it or raise --max-context")
        b, dev = len(prompts), self.device
        gen = torch.Generator(device=dev)
        gen.manual_seed(params.seed if params.seed is not None else torch.seed())
        start = time.perf_counter()
        tcache, dcache = self._cache(b)
        model = self.target.model
        logits, aux = prefill(model, tcache, prompts, self.capture)
        roots = self._sample(logits, params, gen)  # [B] the pending tokens
        rows = _Rows(prompts, params, self.capacity, StopChecker(self.target, params), on_token)
        for i, t in enumerate(roots.tolist()):
            rows.add(i, [t])
        if self.policy.tree(b) is not None and not all(rows.done):
            seed = draft_prefill(self.draft, model.embed, dcache, prompts, aux, roots)
            if self.policy.needs_plain_timing and b not in self.policy.plain_step_s:
                self.policy.plain_step_s[b] = self._time_plain(tcache, roots)
            roots = self._speculate(rows, tcache, dcache, seed, roots, params, gen)
        self._decode_plain(rows, tcache, roots, params, gen)
        elapsed = time.perf_counter() - start
        for c in rows.out:
            c.seconds = elapsed
        return rows.out

    def _speculate(self, rows: _Rows, tcache, dcache, seed, roots, params, gen) -> torch.Tensor:
        """Speculative iterations until every row is done or the policy says plain; returns the pending tokens."""
        b = tcache.batch
        vd = self.draft.config.draft_vocab_size
        while not all(rows.done):
            cfg = self.policy.tree(b)
            if cfg is None:
                break
            steps = self._steps_for(tcache, dcache, cfg, params)
            t0 = time.perf_counter()
            uniform = None if params.greedy else torch.rand(b, cfg.noise_rows, vd, device=self.device, generator=gen)
            tree = share_tree(steps.grow(seed, roots, uniform), self.tp)
            if params.greedy:
                path, n_path, nxt, aux = steps.check(tree)
                acc = Acceptance(path, n_path, nxt)
            else:
                logits, aux = steps.check(tree)
                width = cfg.num_steps + 1
                if self.tp.rank == 0:
                    acc = sample_accept(tree, logits, params, self._draft_to_target, width, gen)
                else:  # filled by share_acceptance
                    zeros = torch.zeros(b, width + 2, dtype=torch.long, device=self.device)
                    acc = Acceptance(zeros[:, :width], zeros[:, width], zeros[:, width + 1])
            acc = share_acceptance(acc, self.tp)
            emitted = acc.emitted(tree)  # [B, S+1]
            counts = acc.n_path.tolist()
            active = [i for i in range(b) if not rows.done[i]]
            for i, toks in zip(active, (emitted[active].tolist() if active else [])):
                rows.out[i].accept_lengths.append(counts[i])
                rows.add(i, toks[: counts[i]])
            n_commit = torch.tensor([0 if rows.done[i] else counts[i] for i in range(b)], device=self.device)
            anchors = emitted  # the token after each path node: the next accepted one, then the next token
            seed = steps.extend(aux, acc.path, n_commit, anchors)
            roots = acc.next_token.clone()
            self.policy.observe(b, time.perf_counter() - t0, sum(counts[i] for i in active), len(active))
        return roots

    def _decode_plain(self, rows: _Rows, tcache, roots, params, gen) -> None:
        """Plain decoding from the committed caches (the pending tokens are not yet in them)."""
        step = self._plain_step(tcache) if not all(rows.done) else None
        # Rows that are done stop advancing; updated when a row ends, not uploaded every step.
        active = torch.tensor([0 if d else 1 for d in rows.done], device=self.device)
        while not all(rows.done):
            logits = step(roots.view(-1, 1))
            tcache.advance(active)
            roots = self._sample(logits, params, gen)
            for i, t in enumerate(roots.tolist()):
                if not rows.done[i]:
                    rows.add(i, [t])
                    if rows.done[i]:
                        active[i] = 0
