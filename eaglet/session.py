"""A running batch that requests join and leave between steps (continuous batching).

A session owns one batch of cache rows and the pending token of each. ``admit`` prefills
prompts into any free rows, in one forward, and returns their first tokens; ``step``
advances every running row by one iteration (plain: a step, or a chunk of steps under CUDA
graphs) and returns the tokens that became final, per row; ``release`` frees a row at once
(finished or aborted). Rows are independent: each has
its own ``lens`` in the caches and an ``active`` flag, and an inactive row commits nothing,
so a freed row is refilled while the others keep running. ``generate`` of PlainGenerator and
SpecEngine is ``decode_all`` over a session; the server's scheduler drives one directly.

Sampling: temperature, top-p and top-k belong to the session (the speculative iteration
is compiled per setting, and one generator draws for every row, seeded by the session's
``seed``); the token limit and stop strings belong to each row. A plain session opened with
``own_draws`` instead gives each row a generator and temperature of its own (``Draws``, at
admission; top-p and top-k stay the session's): a row's tokens then depend on its prompt and
seed only, not on which row it landed in or what ran beside it (regeneration refills rows
continuously and must write the same answers when resumed). This ``Session`` decodes
plainly; ``speculative/session.py`` adds the draft.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from eaglet.errors import EagletError
from eaglet.generate import Completion, DecodeChunks, StopChecker, eos_ids, prefill
from eaglet.kv_cache import Landing, row_index, to_device
from eaglet.loading.target import Target
from eaglet.parallel.state import broadcast_from_rank0
from eaglet.prefill import PrefillGraphs
from eaglet.sampling import SamplingParams, sample, sample_at


class _Row:
    """One request's output: its limit, stop handling, and appends of several tokens."""

    def __init__(self, target: Target, prompt: list[int], params: SamplingParams, capacity: int, eos: frozenset[int]):
        self.prompt = prompt  # a speculative session rebuilds the draft's cache from it (and the output)
        self.out = Completion([], "length")
        self.limit = min(params.max_new_tokens, capacity - len(prompt))
        self.stops = StopChecker(target, params, eos)
        self.done = False

    def add(self, new: list[int]) -> list[int]:
        """Append ``new`` up to the limit or a stop -> the tokens kept (final)."""
        c = self.out
        before = len(c.tokens)
        new = new[: self.limit - before]
        c.tokens.extend(new)
        keep = self.stops.check(c.tokens, len(new)) if new else None
        if keep is not None:
            del c.tokens[keep:]
            c.finish_reason, self.done = "stop", True
        elif len(c.tokens) >= self.limit:
            self.done = True
        return c.tokens[before:]


@dataclass(frozen=True)
class Draws:
    """A row's own random draws (``Session(own_draws=True)``): its generator's seed and its temperature."""

    seed: int
    temperature: float  # 0 = greedy


def same_sampling(a: SamplingParams, b: SamplingParams) -> bool:
    """Whether two requests can share a session (one distribution rule for the batch)."""
    return a.greedy and b.greedy or (a.temperature, a.top_p, a.top_k) == (b.temperature, b.top_p, b.top_k)


class Session:
    """Plain decoding of a batch of rows, one token per running row and step."""

    def __init__(self, target: Target, cache, decode: Callable[[torch.Tensor], torch.Tensor],
                 params: SamplingParams, capacity: int, roots: torch.Tensor | None = None,
                 active: torch.Tensor | None = None, own_draws: bool = False, chunks: DecodeChunks | None = None,
                 prefills: PrefillGraphs | None = None):
        self.target, self.cache, self.decode, self.params, self.capacity = target, cache, decode, params, capacity
        self.prefills = prefills  # the target's prefill captured per bucket (its first output: logits), or None
        dev = cache.lens.device
        self.chunks = chunks  # several steps per host read (greedy and own-draws sessions), else None
        if chunks is not None:  # the tensors its chunks read
            roots, active = chunks.roots, chunks.active
        self.roots = torch.zeros(cache.batch, dtype=torch.long, device=dev) if roots is None else roots  # [B] pending
        self.active = torch.zeros(cache.batch, dtype=torch.long, device=dev) if active is None else active  # [B]
        self.active.zero_()
        self.gen = torch.Generator(device=dev)
        # Unseeded: this generator alone from the OS's entropy. torch.seed() also reseeded every device's default
        # generator, formatting a stack trace for each backend not initialised: 0.14 ms of a 2-core CPU's session
        # opening against 0.014, paid by every request a server answers at concurrency 1.
        if params.seed is not None:
            self.gen.manual_seed(params.seed)
        else:
            self.gen.seed()
        self.rows: dict[int, _Row] = {}
        self.eos = eos_ids(target)
        self.landing = Landing(cache, target.model.new_cache)
        self.own_draws = own_draws
        self.draws: dict[int, tuple[random.Random, float]] = {}  # own_draws: row -> (its generator, temperature)
        self.last_step = "plain"  # what the last step ran: "plain" or the tree's description
        self.verifies = 0  # rows verified over the session, and the tokens they emitted (speculative only)
        self.accepted = 0

    @property
    def batch(self) -> int:
        return self.cache.batch

    def free_rows(self) -> list[int]:
        return [i for i in range(self.batch) if i not in self.rows]

    def running(self) -> list[int]:
        return [i for i, r in self.rows.items() if not r.done]

    def sample(self, logits: torch.Tensor, rows: Sequence[int] | None = None) -> torch.Tensor:
        """Tokens [n] for the rows ``rows`` of logits [n, V] (default: every row), sampled on rank 0 and
        shared: under tensor parallelism every rank continues with them."""
        if self.own_draws:
            toks = self._sample_own(logits, range(self.batch) if rows is None else rows)
        else:
            toks = sample(logits, self.params, self.gen)
        return broadcast_from_rank0(toks, self.target.model.tp)

    def _sample_own(self, logits: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        # Only a row being admitted or still running draws: its generator advances once per token.
        drawing = [i in self.draws and not (i in self.rows and self.rows[i].done) for i in rows]
        temps = [self.draws[i][1] if d else 0.0 for i, d in zip(rows, drawing)]
        if not any(temps):
            return logits.argmax(-1)
        uniform = [self.draws[i][0].random() if t else 0.0 for i, t in zip(rows, temps)]
        dev = logits.device
        return sample_at(logits, to_device(temps, dev), to_device(uniform, dev), self.params)

    def admit(self, rows: int | Sequence[int], prompts: list[list[int]],
              params: SamplingParams | Sequence[SamplingParams], draws: list[Draws] | None = None) -> list[list[int]]:
        """Prefill ``prompts`` into free rows in one forward -> each one's first tokens.

        ``rows``: one free row per prompt, anywhere in the batch (an int ``r`` stands for ``r, r+1, ...``).
        ``params``: one for every prompt, or one each (the token limit and stop strings are a row's own;
        temperature, top-p and top-k must be the session's). ``draws``: each prompt's own generator and
        temperature, in a session opened with ``own_draws``. On an error nothing is admitted.
        """
        rows = list(range(rows, rows + len(prompts))) if isinstance(rows, int) else list(rows)
        each = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(rows) != len(prompts) or len(each) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts need as many rows and settings, got {len(rows)} and {len(each)}")
        if len(set(rows)) < len(rows) or any(not 0 <= i < self.batch or i in self.rows for i in rows):
            raise ValueError(f"rows {rows} are not free in a batch of {self.batch}, or one repeats")
        if (draws is not None) != self.own_draws or draws is not None and len(draws) != len(prompts):
            raise ValueError("a session opened with own_draws takes one Draws per prompt, and no other")
        for p in each:
            if not same_sampling(p, self.params) and not (self.own_draws and (p.top_p, p.top_k) == (
                    self.params.top_p, self.params.top_k)):
                raise ValueError("a session samples every row with the same temperature, top-p and top-k")
        for prompt in prompts:
            self.check_prompt(prompt)
        for i, d in zip(rows, draws or ()):
            self.draws[i] = (random.Random(d.seed), d.temperature)
        roots = self._prefill(rows, prompts)  # [n]
        self.roots[row_index(rows, self.roots.device)] = roots
        first = []
        for i, prompt, p, t in zip(rows, prompts, each, roots.tolist()):
            self.rows[i] = _Row(self.target, prompt, p, self.capacity, self.eos)
            first.append(self._add(i, [t]))
            self.active[i] = 0 if self.rows[i].done else 1
        return first

    def adopt(self, old: Session) -> None:
        """Take over the rows of ``old``, a batch no larger than this empty one, from the same engine and
        sampling setting, at the same row indices: their committed cache slots (one copy a layer),
        pending tokens, flags, outputs and draws. A full batch with requests waiting grows this way
        (the server's scheduler) instead of draining first."""
        n = old.batch
        if n > self.batch or self.rows:
            raise ValueError(f"an empty session of {self.batch} rows adopts at most as many, got {n} into "
                             f"{len(self.rows)} running")
        if old.own_draws != self.own_draws or not same_sampling(old.params, self.params):
            raise ValueError("a session adopts rows sampled as its own are (draws and temperature, top-p, top-k)")
        self.cache.copy_rows_from(old.cache, range(n))
        self.roots[:n] = old.roots
        self.active[:n] = old.active
        self.rows, self.draws, self.gen = dict(old.rows), dict(old.draws), old.gen
        self.verifies, self.accepted = old.verifies, old.accepted

    def check_prompt(self, prompt: list[int]) -> None:
        """Raise if the context cannot hold ``prompt`` and a token: a caller admitting several prompts checks
        each first, so that one too long fails alone."""
        if len(prompt) + 1 > self.capacity:
            raise EagletError(f"the prompt has {len(prompt)} tokens but the context holds {self.capacity}; "
                              "shorten it or raise --max-context")

    def _prefill(self, rows: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Prompts into their rows' caches (one eager forward, or a graph replay per part) -> the sampled
        pending tokens [n]."""
        parts = self.graph_parts(rows, prompts)
        if parts is None:
            with self.landing.into(rows, max(map(len, prompts))) as view:
                return self.sample(prefill(self.target, view, prompts), rows)
        roots = []
        for part_rows, part in parts:
            (logits, *_), view = self.prefills.run(part)
            self.landing.land(view, part_rows, max(map(len, part)))
            roots.append(self.sample(logits[: len(part)], part_rows))
        return torch.cat(roots)

    def graph_parts(self, rows: list[int], prompts: list[list[int]]) -> list[tuple[list[int], list[list[int]]]] | None:
        """The (rows, prompts) of each captured prefill graph that admits ``prompts`` into ``rows`` in order
        (``PrefillGraphs.parts``), or None: one eager forward (no graphs, or a prompt longer than every one)."""
        sizes = self.prefills.parts(prompts) if self.prefills is not None else None
        if sizes is None:
            return None
        return [(rows[i - k: i], prompts[i - k: i]) for i, k in zip(accumulate(sizes), sizes)]

    def _add(self, row: int, tokens: list[int]) -> list[int]:
        r = self.rows[row]
        kept = r.add(tokens)
        if r.done:
            self.active[row] = 0
        return kept

    def step(self, launched: Callable[[], None] | None = None) -> dict[int, list[int]]:
        """One plain step (or chunk of steps) of every running row -> the tokens that became final, per row.

        ``launched`` is called once the step's device work is queued, before the host waits for it (on a
        CPU: once it has run): a server's thread can hand out the last step's tokens while the GPU works."""
        live = self.running()
        if not live:
            return {}
        self.last_step = "plain"
        # A session sampling from one shared generator draws through torch.multinomial, whose
        # stream a chunk's inverse-CDF draws cannot reproduce: it keeps one step per read.
        if self.chunks is not None and (self.params.greedy or self.own_draws):
            toks = self._chunk(live, launched)
            return {i: self._add(i, toks[i]) for i in live}
        logits = self.decode(self.roots.view(-1, 1))  # writes each pending token at its row's lens
        self.cache.advance(self.active)
        self.roots.copy_(self.sample(logits))
        if launched is not None:
            launched()
        toks = self.roots.tolist()
        return {i: self._add(i, [toks[i]]) for i in live}

    def _chunk(self, live: list[int], launched: Callable[[], None] | None) -> list[list[int]]:
        """One chunk of every row -> per row its tokens (those past a stop or limit are ``_add``'s to drop)."""
        k, left, temps = self.chunks.steps, [0] * self.batch, [0.0] * self.batch
        for i in live:
            left[i] = self.rows[i].limit - len(self.rows[i].out.tokens)
            temps[i] = self.draws[i][1] if i in self.draws else 0.0
        if not any(temps):
            return self.chunks(left, launched=launched)
        # Each drawing row's generator gives the uniforms the one-step path would, in order, one a
        # token; a row that stops mid-chunk has drawn past its end, but its generator goes with it.
        uniform = [[0.0] * self.batch for _ in range(k)]
        for i in live:
            if temps[i]:
                for j in range(min(k, left[i])):
                    uniform[j][i] = self.draws[i][0].random()
        return self.chunks(left, self.params, temps, uniform, launched)

    def release(self, row: int) -> Completion:
        """Free a row now (finished or aborted): it stops advancing and can be admitted again."""
        self.active[row] = 0
        self.draws.pop(row, None)
        return self.rows.pop(row).out


def grown(engine, small: Session, batch: int) -> Session:
    """An engine's session of ``batch`` rows holding ``small``'s rows (``Session.adopt``): ``grow`` of
    PlainGenerator and SpecEngine."""
    big = engine.session(batch, small.params)
    big.adopt(small)
    return big


def bucket_size(n: int, graphs: bool) -> int:
    """Under CUDA graphs, the batch rounded up to a power of two.

    Each batch size captures (and compiles) its own graphs; rounding lets a few sizes serve
    every batch, so a last partial batch never compiles inside a timed run. The rows past
    ``n`` are never admitted: they stay inactive and commit nothing.
    """
    return 1 << (n - 1).bit_length() if graphs else n


def admission_size(lengths: list[int], max_tokens: int | None) -> int:
    """How many of the prompts of ``lengths`` (in order) one admission takes: all of them, halved while they
    pad to more than ``max_tokens`` (rows x the longest; None: no bound), at least one. An eager prefill's
    attention scores grow with the rows times the longest prompt squared."""
    n = len(lengths)
    while max_tokens and n > 1 and n * max(lengths[:n]) > max_tokens:
        n //= 2
    return n


def decode_all(session: Session, prompts: list[list[int]], params: SamplingParams,
               on_token: Callable[[int, int], None] | None = None,
               prefill_tokens: int | None = None) -> list[Completion]:
    """Admit every prompt (rows 0..n-1) and step until all are done; ``on_token(row, token)`` streams.
    ``prefill_tokens``: admit in parts of rows in order (``admission_size``)."""
    start = time.perf_counter()
    news, lo = {}, 0
    while lo < len(prompts):
        n = admission_size([len(p) for p in prompts[lo:]], prefill_tokens)
        news.update(enumerate(session.admit(lo, prompts[lo: lo + n], params), lo))
        lo += n
    while True:
        if on_token:
            for i, toks in news.items():
                for t in toks:
                    on_token(i, t)
        if not session.running():
            break
        news = session.step()
    out = [session.release(i) for i in range(len(prompts))]
    for c in out:
        c.seconds = time.perf_counter() - start
    return out
