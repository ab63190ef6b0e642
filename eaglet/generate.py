"""Plain decoding with our runtime: batched prefill, then one token per step.

This is the baseline speculative decoding must match token for token (greedy) and
beat in speed. On CUDA the decode step runs as a captured graph over the whole
cache (static shapes); on CPU it attends only over the slots in use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from eaglet.cuda_graph import GraphedStep, compiled, idle
from eaglet.errors import EagletError
from eaglet.kv_cache import to_device
from eaglet.loading.target import Target
from eaglet.models.layers import pack_linears
from eaglet.parallel.state import broadcast_from_rank0
from eaglet.prefill import PrefillGraphs, token_cap
from eaglet.sampling import SamplingParams, sample_at


@dataclass
class Completion:
    tokens: list[int]
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    seconds: float = 0.0
    accept_lengths: list[int] = field(default_factory=list)  # per verify, speculative only

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


# Slots every target cache carries past the context. The speculative engine writes its drafted
# tree there (scratch past the committed text); plain decoding carries them too, so a plain cache
# and the engine's have one geometry: the same compiled step serves both (the engine's fallback is
# plain decoding's step, and a process running both compiles it once, the second a cache hit).
# At least the default trees' margin (6,8,48: 48 slots); a larger tree gives the engine a larger cache.
TREE_SLACK = 64


def cache_slots(context: int, margin: int = 0) -> int:
    """Slots of a target cache for ``context`` tokens: TREE_SLACK past them, or a larger tree's ``margin``."""
    return context + max(TREE_SLACK, margin)


def context_size(target: Target, max_context: int | None) -> int:
    """The KV capacity: --max-context, else the model's window capped at 4096."""
    window = target.config.context_window
    size = min(window, 4096) if max_context is None else max_context
    if size < 2 or size > window:
        raise EagletError(f"--max-context must be between 2 and the model's window {window}, got {size}")
    return size


def eos_ids(target: Target) -> frozenset[int]:
    """The ids that end an answer: the config's and the tokenizer's EOS."""
    ids = set(target.config.eos_token_ids)
    if target.tokenizer is not None and target.tokenizer.eos_token_id is not None:
        ids.add(target.tokenizer.eos_token_id)
    return frozenset(ids)


class StopChecker:
    """EOS ids and stop strings, per sequence."""

    def __init__(self, target: Target, params: SamplingParams, eos: frozenset[int] | None = None):
        # ``eos``: eos_ids(target), read once by a caller making many (the tokenizer's property costs ~30 us)
        self.eos = eos_ids(target) if eos is None else eos
        self.tok = target.tokenizer
        self.stops = params.stop

    def check(self, tokens: list[int], n_new: int = 1) -> int | None:
        """How many tokens to keep if the last ``n_new`` end the sequence, else None.

        EOS is dropped; a stop string is kept up to the token that completes it.
        """
        start = len(tokens) - n_new
        if not self.eos.isdisjoint(tokens[start:]):  # one C-level test: most rows of a step have no EOS
            for i in range(start, len(tokens)):
                if tokens[i] in self.eos:
                    return self._stop_in(tokens[:i]) or i
        return self._stop_in(tokens) if self.stops else None

    def _stop_in(self, tokens: list[int]) -> int | None:
        if not self.stops or not any(s in self.tok.decode(tokens) for s in self.stops):
            return None
        for n in range(1, len(tokens) + 1):  # the shortest prefix holding a stop string
            if any(s in self.tok.decode(tokens[:n]) for s in self.stops):
                return n
        return None


def pad_batch(seqs: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, T] and lengths [B], built on the host and copied once (a row at a time on a GPU
    was two launches a row: hundreds for one of regeneration's admissions)."""
    lengths = torch.tensor([len(s) for s in seqs])
    ids = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    return ids.to(device), lengths.to(device)


def prefill(target: Target, cache, prompts: list[list[int]]) -> torch.Tensor:
    """Right-padded batched prefill; returns each row's last-position logits [B, V]."""
    ids, lengths = pad_batch(prompts, cache.lens.device)
    logits, _ = prefill_forward(target.model, cache, ids, lengths - 1)
    cache.advance(lengths)
    return logits


def prefill_forward(model, cache, ids: torch.Tensor, last: torch.Tensor, capture: tuple[int, ...] = (),
                    n_slots: int | None = None, empty: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ids [B, T] after each row's committed slots (not advanced) -> (logits at each row's position ``last``
    [B, V], the captured points [B, T, k*H] or None). ``n_slots``: static shapes; ``empty``: the rows hold nothing
    (both: ``prefill.PrefillGraphs``)."""
    h, aux = model(ids, cache.append_meta(ids.shape[1], n_slots, empty), cache, capture=capture)
    return model.logits(h[torch.arange(ids.shape[0], device=ids.device), last]), aux


def decode_step(model, cache, static: bool, compile: bool = False,
                graph: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """ids [B, 1] -> logits [B, V], written at the slot above ``cache.lens`` (not advanced).

    ``static``: attend over the whole cache (the shapes a CUDA graph needs); ``compile``
    fuses the step; ``graph`` captures it for replay. The speculative engine's plain
    fallback is this same step, so falling back costs what plain decoding costs.
    """
    n_slots = cache.capacity if static else None

    def step(ids: torch.Tensor) -> torch.Tensor:
        h, _ = model(ids, cache.append_meta(1, n_slots), cache)
        return model.logits(h[:, -1])

    if compile:
        step = _compiled(step, f"the decode step for batch {cache.batch}")
    if not graph:
        return step
    return GraphedStep(step, torch.zeros(cache.batch, 1, dtype=torch.long, device=cache.lens.device))


def _compiled(fn: Callable, what: str) -> Callable:
    # torch.compile's default mode: per-shape max-autotune took minutes a batch size on an H200.
    return compiled(fn, what, fullgraph=True, dynamic=False)


def target_prefills(target: Target, capacity: int, graphs: bool, bucketed: bool | None,
                    capture: tuple[int, ...] = (), compile: bool = False) -> PrefillGraphs | None:
    """The target's prefill per bucket (``prefill.PrefillGraphs``: logits, then the captured points when
    ``capture``; ``compile``: fused first), or None where ``bucketed`` (default: ``graphs``) is off."""
    if not (graphs if bucketed is None else bucketed):
        return None
    model = target.model

    def forward(ids: torch.Tensor, last: torch.Tensor, cache) -> tuple[torch.Tensor, ...]:
        logits, aux = prefill_forward(model, cache, ids, last, capture, ids.shape[1], empty=True)
        return (logits, aux) if capture else (logits,)

    params = sum(p.numel() for p in model.parameters())
    return PrefillGraphs(model.new_cache, forward, model.embed.weight.device, capacity, token_cap(params),
                         graphs=graphs, compile=compile)


# Plain steps per chunk under CUDA graphs. At batch 1 on the H200 the host's work per token
# (replay, advance, sampling, a sync, bookkeeping) took the compiled 0.985 ms step from 1,015
# steps/s to 849 tok/s end to end; 8 steps per replay and read leave ~1/8 of that overhead,
# while a joining request, a stop or an abort waits at most 7 steps more (~7 ms) and a row
# that stops mid-chunk computes at most 7 steps for nothing.
CHUNK_STEPS = 8


class DecodeChunks:
    """``steps`` plain steps of every row as one function of device tensors: one replay, one host read.

    Each step decodes the pending tokens ``roots``, advances a row's ``lens`` while it is
    ``active`` and has tokens ``left``, picks the next tokens (greedy; or ``sample_at``, each row
    at its ``temps`` and at uniforms its own generator drew before the chunk: ``Session``'s
    ``own_draws``) and writes them into ``roots`` and column j of the [B, steps] result. A row
    that stops mid-chunk (EOS, a stop string) computes on to the chunk's end; its writes lie past
    its committed text (nothing reads them; admission resets the row). ``left`` holds ``lens`` at
    the row's token limit, which the context bounds, so no write passes the cache's capacity and
    the cache, the prefill and the step's geometry are those of the one-step path. Under tensor
    parallelism the tokens are broadcast from rank 0 inside the chunk, as the speculative
    iteration does inside its graph. Built per sampling rule (greedy, or per top-p and top-k).
    """

    def __init__(self, model, cache, steps: int, static: bool, compile: bool, graph: bool,
                 roots: torch.Tensor | None = None, active: torch.Tensor | None = None):
        b, dev = cache.batch, cache.lens.device
        self.model, self.cache, self.steps, self.static, self.compile, self.graph = \
            model, cache, steps, static, compile, graph
        # ``roots`` and ``active`` may be another owner's (the speculative engine's fallback shares its state's).
        self.roots = torch.zeros(b, dtype=torch.long, device=dev) if roots is None else roots  # [B] pending tokens
        self.active = torch.zeros(b, dtype=torch.long, device=dev) if active is None else active  # [B] 1 while running
        self.left = torch.zeros(b, dtype=torch.long, device=dev)  # [B] tokens a row may still emit
        # float32, as the one-step path's tensors of the same draws, so the tokens are the same.
        self.temps = torch.zeros(b, device=dev)  # [B] 0 = greedy
        self.uniform = torch.zeros(steps, b, device=dev)  # [steps, B]
        self._u = torch.zeros(b, device=dev)  # the current step's row of ``uniform``
        self.out = torch.zeros(b, steps, dtype=torch.long, device=dev)
        self._built: dict[tuple | None, Callable[[], torch.Tensor]] = {}

    def __call__(self, left: list[int], sampled: SamplingParams | None = None, temps: list[float] | None = None,
                 uniform: list[list[float]] | None = None,
                 launched: Callable[[], None] | None = None) -> list[list[int]]:
        """One chunk -> per row its ``steps`` tokens. ``left`` [B]: tokens each row may still emit;
        ``sampled``: top-p and top-k of a sampled chunk, with ``temps`` [B] and ``uniform`` [steps][B];
        ``launched``: called once the chunk is queued, before the host reads it."""
        dev = self.left.device
        self.left.copy_(to_device(left, dev))
        if sampled is not None:
            self.temps.copy_(to_device(temps, dev))
            self.uniform.copy_(to_device(uniform, dev))
        out = self.chunk(sampled)()
        if launched is not None:
            launched()
        return out.tolist()

    def chunk(self, sampled: SamplingParams | None = None) -> Callable[[], torch.Tensor]:
        """The chunk of one sampling rule (built, compiled and captured on first use) -> [B, steps]."""
        key = None if sampled is None else (sampled.top_p, sampled.top_k)
        if key not in self._built:
            self._built[key] = self._build(sampled)
        return self._built[key]

    def release(self) -> None:
        """Drop the built chunks: each one's closure holds this object, and so its cache, in a cycle."""
        self._built.clear()

    def idle(self):
        """Every row inactive, so a chunk run inside commits nothing; the state is restored after."""
        return idle(self.active, self.roots, self.left)

    def _build(self, sampled: SamplingParams | None) -> Callable[[], torch.Tensor]:
        step, cache = decode_step(self.model, self.cache, self.static), self.cache

        def one() -> torch.Tensor:
            logits = step(self.roots.view(-1, 1))
            go = self.active * (self.left > 0)
            cache.advance(go)
            self.left.sub_(go)
            return logits.argmax(-1) if sampled is None else sample_at(logits, self.temps, self._u, sampled)

        if self.compile:  # one step compiled and called ``steps`` times: a chunk compiles as fast as a step
            rule = "greedy" if sampled is None else "sampled"
            one = _compiled(one, f"the {self.steps}-step {rule} decode chunk for batch {cache.batch}")

        def chunk() -> torch.Tensor:
            for j in range(self.steps):
                if sampled is not None:
                    self._u.copy_(self.uniform[j])
                self.roots.copy_(broadcast_from_rank0(one(), self.model.tp))
                self.out[:, j] = self.roots
            return self.out

        if not self.graph:
            return chunk
        with self.idle():  # warm-up runs the chunk for real: idle, it only writes past committed slots
            return GraphedStep(chunk)


class PlainGenerator:
    def __init__(self, target: Target, max_context: int | None = None, use_graphs: bool | None = None,
                 compile: bool | None = None, chunk: int | None = None, bucketed_prefill: bool | None = None,
                 compile_prefill: bool = False):
        """``bucketed_prefill``: prefill through ``PrefillGraphs`` (default: under CUDA graphs, where they are
        captured; set on the CPU it runs the same padded forwards eagerly, a test mode); ``compile_prefill``:
        their forward fused by torch.compile first (``--compile-prefill``, an experiment)."""
        self.target = target
        self.capacity = context_size(target, max_context)
        self.device = target.model.embed.weight.device
        on_cuda = self.device.type == "cuda"
        self.use_graphs = on_cuda if use_graphs is None else use_graphs
        # Fusion (torch.compile) is what takes a small model's step from launch-bound
        # toward the bandwidth floor; on CPU its start-up cost outweighs the gain.
        self.compile = on_cuda if compile is None else compile
        if self.device.type == "cpu" and not self.compile:
            pack_linears(target.model)  # oneDNN's packed GEMMs (models/layers.py)
        # Steps per host read (``DecodeChunks``): the chunk pays where replays are cheap and the
        # host is the gap (CUDA graphs); eagerly each step's launches dwarf the read, so one,
        # unless asked (tests run the chunk's logic eagerly).
        self.chunk = (CHUNK_STEPS if self.use_graphs else 1) if chunk is None else chunk
        self._graphs: dict[int, object] = {}
        self._caches: dict[int, object] = {}
        self._chunks: dict[int, DecodeChunks] = {}
        self.prefills = target_prefills(target, self.capacity, self.use_graphs, bucketed_prefill,
                                        compile=compile_prefill)

    def _cache(self, batch: int):
        if batch not in self._caches:
            self._caches[batch] = self.target.model.new_cache(batch, cache_slots(self.capacity))
        cache = self._caches[batch]
        cache.reset()
        return cache

    def _step_fn(self, cache) -> Callable[[torch.Tensor], torch.Tensor]:
        b = cache.batch
        if not self.use_graphs:
            return decode_step(self.target.model, cache, static=False)
        if b not in self._graphs:
            self._graphs[b] = decode_step(self.target.model, cache, static=True, compile=self.compile, graph=True)
        return self._graphs[b]

    def _chunks_of(self, cache) -> DecodeChunks | None:
        if self.chunk == 1:
            return None
        if cache.batch not in self._chunks:
            self._chunks[cache.batch] = DecodeChunks(self.target.model, cache, self.chunk, self.use_graphs,
                                                     self.compile, self.use_graphs)
        return self._chunks[cache.batch]

    @torch.inference_mode()
    def prepare(self, batch: int) -> None:
        """Build (compile, capture) what a session of ``batch`` rows runs now rather than at its first use:
        the one-step step (a session sampling from one shared generator runs it) and the greedy chunk."""
        cache = self._cache(batch)
        self._step_fn(cache)
        if (chunks := self._chunks_of(cache)) is not None:
            run = chunks.chunk()
            with chunks.idle():  # launched once here, as the speculative engine's cost probe launches its own: a
                run()  # plain server's first request met a 1.24 s wait on the H200 that the other did not (unproven)

    def session(self, batch: int, params: SamplingParams, own_draws: bool = False):
        """A running batch of ``batch`` rows (one live session per batch size: they share a cache);
        ``own_draws``: each row samples from a generator of its own (``Session``)."""
        from eaglet.session import Session

        cache = self._cache(batch)
        # The one-step step is built at its first use: a greedy or own-draws session runs chunks only.
        return Session(self.target, cache, lambda ids: self._step_fn(cache)(ids), params, self.capacity,
                       own_draws=own_draws, chunks=self._chunks_of(cache), prefills=self.prefills)

    def grow(self, small, batch: int):
        """A session of ``batch`` rows holding ``small``'s rows (a full batch growing in place)."""
        from eaglet.session import grown

        return grown(self, small, batch)

    def release(self) -> None:
        """Drop every cache, captured step and chunk (a chunk and its closure hold each other, and its cache,
        until the cyclic collector runs): a stage done with this generator hands its memory back now; the
        generator is not used after."""
        for chunks in self._chunks.values():
            chunks.release()
        self._chunks.clear()
        self._graphs.clear()
        self._caches.clear()
        self.prefills = None

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 on_token: Callable[[int, int], None] | None = None, batch: int | None = None,
                 prefill_tokens: int | None = None) -> list[Completion]:
        """Decode each prompt; ``on_token(row, token)`` streams tokens as they are final. ``batch``: the rows
        of the session (and its cache) to run them in, at least ``len(prompts)``; a caller of several batch
        sizes keeps one cache with it (default: ``len(prompts)``, under CUDA graphs its bucket).
        ``prefill_tokens``: the prompts are prefilled in parts of at most this many padded tokens (default:
        one forward, whose attention scores grow with the rows times the longest prompt squared)."""
        from eaglet.session import bucket_size, decode_all

        return decode_all(self.session(batch or bucket_size(len(prompts), self.use_graphs), params), prompts,
                          params, on_token, prefill_tokens)
