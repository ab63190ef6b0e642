"""Speculative decoding with an EAGLE-3 draft: grow a tree, verify it in one pass, accept, commit.

One iteration, per batch (every row has its own tree, acceptance and lengths):

1. tree.py grows a tree from the draft output at the last anchor (root = pending token);
2. verify.py runs the target once over all nodes, capturing the draft's points;
3. accept.py keeps a path (greedy, or recursive rejection sampling) and picks the next token;
4. drafting.py commits the path in the target cache and extends the draft cache;
5. the host reads the emitted tokens and applies EOS, stop strings and limits per row.

Requests join and leave a running batch between iterations through a session
(``session.py``): ``generate`` is a session that admits every prompt at once.

Steps 1-4 are one function of device tensors (``_Iteration``): on CUDA one compiled
CUDA graph per (batch, tree, sampling settings), replayed with no host synchronisation
inside; the host reads one packed [B, W+1] result per iteration through pinned memory
and marks finished rows inactive on the device (they commit nothing). The randomness of
the sampling path is drawn into the graph's input buffers before each replay. CPU: the
same function runs eagerly. policy.py decides the tree per batch size from measured
costs and acceptance, and falls back to plain decoding when speculation would be slower.

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

from eaglet.cuda_graph import GraphedStep, compiled, idle
from eaglet.errors import EagletError
from eaglet.generate import (
    CHUNK_STEPS,
    Completion,
    DecodeChunks,
    cache_slots,
    context_size,
    decode_step,
    target_prefills,
)
from eaglet.loading.target import Target
from eaglet.models.layers import pack_linears
from eaglet.parallel.state import TPGroup, broadcast_from_rank0
from eaglet.sampling import SamplingParams
from eaglet.session import bucket_size, decode_all, grown
from eaglet.speculative.accept import Acceptance, greedy_accept, sample_accept
from eaglet.speculative.drafting import commit_and_extend, draft_prefills
from eaglet.speculative.policy import BatchPolicy
from eaglet.speculative.session import SpecSession
from eaglet.speculative.tree import Tree, TreeConfig, argmax, build_tree
from eaglet.speculative.verify import verify


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


class _State:
    """What one iteration reads and rewrites in place, per batch size (shared by its trees)."""

    def __init__(self, batch: int, hidden: int, dtype: torch.dtype, device: torch.device):
        self.seed = torch.zeros(batch, hidden, dtype=dtype, device=device)  # [B, H] draft output at the last anchor
        self.roots = torch.zeros(batch, dtype=torch.long, device=device)  # [B] pending tokens
        self.active = torch.ones(batch, dtype=torch.long, device=device)  # [B] 0 once a row is done

    def idle(self):
        """Every row inactive, so an iteration run inside commits nothing; the state is restored after."""
        return idle(self.active, self.seed, self.roots)


class _Iteration:
    """One whole iteration for one (batch, tree, sampling): grow, verify, accept, commit, extend.

    A function of device tensors only, with no host synchronisation inside, so on CUDA it
    is compiled and captured as one graph. It reads ``state`` and the caches, rewrites
    them in place (finished rows commit nothing) and returns one packed [B, W+1] result:
    the emitted tokens (accepted, then the next token; W = num_steps + 1) and their count.
    The host copies that through pinned memory: the one read per iteration.
    """

    def __init__(self, eng: SpecEngine, tcache, dcache, state: _State, cfg: TreeConfig, params: SamplingParams):
        model, draft, embed, capture, tp = eng.target.model, eng.draft, eng.target.model.embed, eng.capture, eng.tp
        t_slots, d_slots = (tcache.capacity, dcache.capacity) if eng.static_shapes else (None, None)
        b, dev, width, context = tcache.batch, eng.device, cfg.num_steps + 1, eng.capacity
        self.cfg, self.state, self.device = cfg, state, dev
        self.noise: list[torch.Tensor] = []  # uniforms the sampling path reads, redrawn before each call
        if not params.greedy:
            vd, v = draft.config.draft_vocab_size, model.cfg.vocab_size
            self.noise = [torch.zeros(b, cfg.noise_rows, vd, device=dev),  # tree growth
                          torch.zeros(b, width - 1, cfg.topk, device=dev),  # accept tests
                          torch.zeros(b, v, device=dev)]  # the recovered or bonus token
        d2t = eng.draft_to_target

        def run() -> torch.Tensor:
            grow_u = self.noise[0] if self.noise else None
            tree = share_tree(build_tree(draft, embed, state.seed, state.roots, dcache, cfg, params, grow_u, d_slots),
                              tp)
            logits, aux = verify(model, tcache, tree, capture, t_slots)
            if params.greedy:
                acc = greedy_accept(tree, argmax(logits), width)
            elif tp.rank == 0:
                acc = sample_accept(tree, logits, params, d2t, width, self.noise[1], self.noise[2])
            else:  # filled by share_acceptance
                zeros = torch.zeros(b, width + 2, dtype=torch.long, device=dev)
                acc = Acceptance(zeros[:, :width], zeros[:, width], zeros[:, width + 1])
            acc = share_acceptance(acc, tp)
            emitted = acc.emitted(tree)  # [B, W]: the token after each path node
            # A row that reaches the context commits no further (the host drops the tokens past its limit):
            # finished rows still grow trees above their length, which the cache's margin holds only there.
            n_commit = torch.minimum(acc.n_path, (context - tcache.lens).clamp(min=0)) * state.active
            seed = commit_and_extend(draft, embed, tcache, dcache, aux, acc.path, n_commit, emitted, d_slots)
            state.seed.copy_(seed)
            state.roots.copy_(acc.next_token)
            return torch.cat([emitted, acc.n_path.view(-1, 1)], dim=1)  # [B, W+1]

        if eng.compile:
            run = compiled(run, f"the iteration of tree {cfg.describe()} for batch {b}", dynamic=False)
        self._run = run
        self.host = torch.zeros(b, width + 1, dtype=torch.long, pin_memory=dev.type == "cuda")
        if eng.use_graphs:
            # Warm-up and capture run the iteration for real: idle, they only write scratch slots.
            with state.idle():
                self._run = GraphedStep(run)

    def __call__(self, gen: torch.Generator, launched: Callable[[], None] | None = None) -> list[list[int]]:
        """Run one iteration -> per row [emitted tokens (W)..., count]; ``launched`` as ``Session.step``'s."""
        for u in self.noise:
            u.uniform_(generator=gen)
        packed = self._run()
        self.host.copy_(packed, non_blocking=True)
        if launched is not None:
            launched()
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        return self.host.tolist()


class SpecEngine:
    """Target + EAGLE-3 draft. ``generate`` has PlainGenerator's interface and output."""

    def __init__(self, target: Target, draft, max_context: int | None = None, num_steps: int | None = None,
                 topk: int | None = None, num_draft_tokens: int | None = None, use_graphs: bool | None = None,
                 adaptive: bool = True, log: Callable[[str], None] = _stderr, static_shapes: bool | None = None,
                 compile: bool | None = None, chunk: int | None = None, bucketed_prefill: bool | None = None,
                 compile_prefill: bool = False):
        given = {"--num-steps": num_steps, "--tree-topk": topk, "--num-draft-tokens": num_draft_tokens}
        if any(v is not None for v in given.values()) and any(v is None for v in given.values()):
            missing = ", ".join(k for k, v in given.items() if v is None)
            raise EagletError(f"set all of --num-steps, --tree-topk and --num-draft-tokens, or none of them "
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
        on_cuda = self.device.type == "cuda"
        self.use_graphs = on_cuda if use_graphs is None else use_graphs
        # Graphs need static shapes; the dense (SDPA) path then spans the whole cache, the
        # CUDA kernel only the slots in use. Without graphs static shapes are a test mode.
        self.static_shapes = self.use_graphs or bool(static_shapes)
        # Fusion is what makes a small model's step fast on CUDA (default mode: no per-shape
        # autotuning, so a new (batch, tree) compiles in seconds, not minutes).
        self.compile = (on_cuda and self.use_graphs) if compile is None else bool(compile)
        if self.device.type == "cpu" and not self.compile:
            pack_linears(target.model)  # oneDNN's packed GEMMs (models/layers.py), draft and target
            pack_linears(draft)
        # Plain steps per host read after a fallback, as PlainGenerator decodes (1: one step a read).
        self.chunk = (CHUNK_STEPS if self.use_graphs else 1) if chunk is None else chunk
        self.policy = BatchPolicy(self.device.type, fixed, adaptive, log, agree=self._rank0_says, ready=self._built)
        self._caches: dict[int, tuple] = {}
        self._iterations: dict[tuple, _Iteration] = {}
        self._plain: dict[int, Callable] = {}
        self._chunks: dict[int, DecodeChunks] = {}
        self.draft_to_target = draft.vocab_ids()
        # Prefill per bucket (captured under CUDA graphs): the target's with capture, then the draft's anchors.
        self.prefills = target_prefills(target, self.capacity, self.use_graphs, bucketed_prefill, self.capture,
                                        compile_prefill)
        self.draft_prefills = draft_prefills(draft, target.model.embed, self.prefills,
                                             len(self.capture) * c.target_hidden) if self.prefills else None

    def _rank0_says(self, flag: bool) -> bool:
        """Rank 0's value of a per-rank decision (the policy's, from per-rank timings)."""
        if self.tp.size == 1:
            return flag
        return bool(broadcast_from_rank0(torch.tensor([flag], device=self.device), self.tp).item())

    def _built(self, batch: int, cfg: TreeConfig) -> bool:
        """Whether running ``cfg`` at ``batch`` now builds nothing: always without torch.compile (an eager
        iteration, or a graph captured in about a second), else once its iteration has been compiled (for
        some sampling setting: a server warms greedy up; another setting compiles on its first use anyway)."""
        return not self.compile or any(key[:2] == (batch, cfg) for key in self._iterations)

    def _margin(self, batch: int) -> int:
        return max(max(t.num_draft_tokens, t.region, t.num_steps + 1) for t in self.policy.ladder(batch))

    def _cache(self, batch: int):
        if batch not in self._caches:
            cap = cache_slots(self.capacity, self._margin(batch))  # plain decoding's geometry
            dtype = self.target.model.embed.weight.dtype
            self._caches[batch] = (self.target.model.new_cache(batch, cap), self.draft.new_cache(batch, cap),
                                   _State(batch, self.draft.config.hidden_size, dtype, self.device))
        tcache, dcache, state = self._caches[batch]
        tcache.reset()
        dcache.reset()
        return tcache, dcache, state

    def _iteration(self, batch: int, cfg: TreeConfig, params: SamplingParams) -> _Iteration:
        key = (batch, cfg, None if params.greedy else (params.temperature, params.top_k, params.top_p))
        if key not in self._iterations:
            tcache, dcache, state = self._caches[batch]
            self._iterations[key] = _Iteration(self, tcache, dcache, state, cfg, params)
        return self._iterations[key]

    def _plain_step(self, tcache) -> Callable[[torch.Tensor], torch.Tensor]:
        """PlainGenerator's step (compiled and graphed on CUDA): the fallback and the yardstick."""
        b = tcache.batch
        if b not in self._plain:
            self._plain[b] = decode_step(self.target.model, tcache, self.static_shapes,
                                         compile=self.compile, graph=self.use_graphs)
        return self._plain[b]

    def fallback_chunks(self, batch: int) -> DecodeChunks | None:
        """PlainGenerator's chunked decoding over this batch size's target cache and state (``roots`` and
        ``active`` shared with the iterations), for greedy sessions that fell back; None at ``chunk`` 1."""
        if self.chunk == 1:
            return None
        if batch not in self._chunks:
            tcache, _, state = self._caches[batch]
            self._chunks[batch] = DecodeChunks(self.target.model, tcache, self.chunk, self.static_shapes,
                                               self.compile, self.use_graphs, state.roots, state.active)
        return self._chunks[batch]

    def _measure(self, fn: Callable[[], object], state: _State, reps: int = 3) -> float:
        """Median seconds of ``reps`` runs of ``fn`` with every row idle (nothing committed), after two warm-up
        runs. The policy's 3 rank trees; reading 0.1 ms from one call takes more (scripts/spec_step_costs.py)."""
        times = []
        with state.idle():
            for _ in range(reps + 2):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return sorted(times[2:])[reps // 2]

    def _costs(self, batch: int, cfg: TreeConfig, params: SamplingParams) -> None:
        """Time a plain step and this tree's iteration once (per engine, batch size and tree).

        The timed iterations draw from a generator of their own: drawing from the session's
        would make a seeded request's answer depend on whether its tree had been timed before.
        """
        gen = torch.Generator(device=self.device)
        tcache, _, state = self._caches[batch]
        if batch not in self.policy.plain_step_s:
            # The yardstick is plain decoding as it would run here: a chunk's steps per host read when the
            # fallback decodes in chunks (a greedy session's), else one step and its read.
            chunks = self.fallback_chunks(batch) if params.greedy else None
            if chunks is not None:
                run = chunks.chunk()
                per_step = self._measure(lambda: run().tolist(), state) / chunks.steps
            else:
                step = self._plain_step(tcache)
                per_step = self._measure(lambda: step(state.roots.view(-1, 1)).argmax(-1).tolist(), state)
            self.policy.plain_step_s[batch] = per_step
        if self.policy.iteration_s.get((batch, cfg)) is None:
            it = self._iteration(batch, cfg, params)
            self.policy.iteration_s[(batch, cfg)] = self._measure(lambda: it(gen), state)

    @torch.inference_mode()
    def prepare(self, batch: int) -> None:
        """Build (compile, capture) and time what a greedy session of ``batch`` rows runs first, now
        rather than inside its first request: the plain step and the iteration of the policy's tree."""
        tcache, _, _ = self._cache(batch)
        cfg = self.policy.tree(batch)
        if cfg is None:
            self._plain_step(tcache)
        else:
            self._costs(batch, cfg, SamplingParams())

    def session(self, batch: int, params: SamplingParams) -> SpecSession:
        """A running batch of ``batch`` rows (one live session per batch size: they share its caches)."""
        return SpecSession(self, batch, params)

    def grow(self, small: SpecSession, batch: int) -> SpecSession:
        """A session of ``batch`` rows holding ``small``'s rows (a full batch growing in place)."""
        return grown(self, small, batch)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 on_token: Callable[[int, int], None] | None = None) -> list[Completion]:
        """Decode each prompt; ``on_token(row, token)`` streams tokens as they are final."""
        return decode_all(self.session(bucket_size(len(prompts), self.use_graphs), params), prompts, params,
                          on_token)
