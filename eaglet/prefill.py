"""Prefill as captured CUDA graphs: a joining prompt's forward as one replay, not ~1,000 launches.

An eager prefill of a 30-layer model issues about a thousand kernels, each launched from
Python; at batch 1 on an H200 a prompt's fixed cost was ~24 ms (plain and speculative alike),
a sixth of a 148-token answer's time. Here each (rows, length) bucket captures its forward
once: prompts are right-padded to the bucket's length and rows (padded rows and positions
compute on zeros, and nothing reads what they write), run into a scratch cache of the
bucket's rows, and the rows' committed slots are then copied into the batch's cache.

Buckets: rows rounded up to a power of two, lengths up to ``LENGTHS[-1]``, at most
``MAX_TOKENS`` padded tokens (rows x length), fewer for a large model (``token_cap``), past which
compute, not launches, sets the time. A larger admission is split into graphs that fit
(``parts``); one with a prompt longer than every bucket stays eager. Regeneration admits tens
of rows at a time at batch 512, and each eager admission cost about as much as a few steps of
the whole batch (inferred from its rate, not profiled). The graphs of one ``PrefillGraphs``
share one memory pool and one scratch cache of that many slots, seen as rows x slots per row
bucket: they never run at once, each output stays allocated (so no capture reuses another's
outputs), and a prefill's rows are copied out before the next one runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from eaglet.cuda_graph import GraphedStep
from eaglet.kv_cache import KVCache, to_device

MAX_TOKENS = 16384  # padded tokens of the largest graphed prefill (SmolLM2: a 377 MB scratch cache in bf16)
# A graphed prefill's compute at most (2 FLOPs a parameter a token): ~30 ms on an H200, about what an eager
# prefill's launches cost; past it compute sets the time, graph or not, so a large model graphs fewer tokens.
FLOP_BUDGET = 1.5e13
LENGTHS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
# Rows of the buckets that ``compile`` fuses. One row is a shape of its own to dynamo (sizes of 1 specialize), so
# fusing more rows took a second compile with the rows symbolic: on a fresh H100 the first (one row, every length)
# took 50-117 s and the second more than 180 s (session 43), most of a server's minutes of warm-up, for ~3 ms less
# a multi-row admission (the unfused graph replays ~1,000 kernels, session 17), which continuous batching makes
# rare: requests finish at different steps and join one at a time, and a batch's first wave is admitted once.
FUSED_ROWS = 1

# forward(ids [R, L], last [R], cache of R rows at lens 0, *extra) -> output tensors; runs L tokens a row
# over slots 0..L-1 (static shapes) and reads position ``last`` of each row's output.
Forward = Callable[..., tuple[torch.Tensor, ...]]


def token_cap(params: int) -> int:
    """Padded tokens of the largest graphed prefill of a model of ``params`` parameters (on this rank): a
    power of two, at most MAX_TOKENS (SmolLM2), 512 for an 8B model."""
    cap = int(FLOP_BUDGET // (2 * params))
    return max(LENGTHS[0], min(MAX_TOKENS, 1 << (cap.bit_length() - 1)))


def _length_symbolic(fused: Forward) -> Forward:
    """``fused`` with each bucket's length dimension (ids [R, L], extras [R, L, ...]) symbolic from the first call.
    Left to torch's automatic dynamic shapes the first bucket compiles with static shapes and the second compiles
    again with the length symbolic: one compile more for every model that prefills (a fresh H200's server took 108 s
    to warm its fused prefills, session 28, where the unfused graphs took 32 s). Only one row's buckets come here
    (``FUSED_ROWS``)."""

    def forward(ids: torch.Tensor, last: torch.Tensor, cache: KVCache, *extra: torch.Tensor):
        for x in (ids, *extra):
            torch._dynamo.maybe_mark_dynamic(x, 1)
        return fused(ids, last, cache, *extra)

    return forward


class PrefillGraphs:
    """One model's prefill (``forward``), captured per bucket on first use.

    ``max_length``: the longest bucket (the context: positions past it are outside the rotary table);
    ``max_tokens``: padded tokens (rows x length) of the largest bucket, and the scratch cache's slots;
    ``extra(rows, length)``: example tensors of what ``forward`` reads besides the ids (the draft's
    captured points), for capturing ahead of use; ``graphs``: capture (CUDA), else run the same
    padded forwards eagerly (tests of the bucketing on the CPU). ``compile``: fuse the buckets of ``FUSED_ROWS``
    with torch.compile before capturing (the length symbolic from the first bucket, so they share one compile): the
    engines' ``--compile-prefill``, on by default in ``bench`` and ``serve`` under CUDA graphs. Buckets of more
    rows capture ``forward`` unfused.
    """

    def __init__(self, new_cache: Callable[[int, int], KVCache], forward: Forward, device: torch.device,
                 max_length: int, max_tokens: int = MAX_TOKENS,
                 extra: Callable[[int, int], tuple[torch.Tensor, ...]] = lambda rows, length: (), graphs: bool = True,
                 compile: bool = False):
        self.fused = _length_symbolic(torch.compile(forward)) if compile else None
        self.new_cache, self.forward, self.device, self.extra, self.graphs = new_cache, forward, device, extra, graphs
        self.lengths = [x for x in LENGTHS if x <= min(max_length, max_tokens)]
        self.max_length, self.max_tokens = max_length, max_tokens
        self.storage: KVCache | None = None  # max_tokens slots, made at the first graph
        self.scratch: dict[int, KVCache] = {}  # rows -> the storage as rows x (max_tokens / rows) slots
        self.steps: dict[tuple[int, int], Callable[..., tuple[torch.Tensor, ...]]] = {}
        self.pool = torch.cuda.graph_pool_handle() if graphs else None

    @property
    def compiled(self) -> bool:
        return self.fused is not None

    def bucket(self, n: int, longest: int) -> tuple[int, int] | None:
        """(rows, length) of the graph that prefills ``n`` prompts of at most ``longest`` tokens, or None (eager)."""
        rows = 1 << (n - 1).bit_length()
        length = next((x for x in self.lengths if x >= longest), None)
        return None if length is None or rows * length > self.max_tokens else (rows, length)

    def parts(self, prompts: list[list[int]]) -> list[int] | None:
        """How many of ``prompts``, in order, each graphed prefill takes: all at once when one bucket holds
        them, else the largest power of two of rows that a bucket holds, and so on; None when a prompt is
        longer than every bucket (the admission is prefilled eagerly)."""
        if not self.lengths or max(map(len, prompts)) > self.lengths[-1]:
            return None
        sizes, i = [], 0
        while i < len(prompts):
            left = len(prompts) - i
            k = left if self.bucket(left, max(map(len, prompts[i:]))) else 1 << (left.bit_length() - 1)
            while self.bucket(k, max(map(len, prompts[i: i + k]))) is None:
                k //= 2  # one row always fits: every prompt fits a length, and lengths stop at max_tokens
            sizes.append(k)
            i += k
        return sizes

    def run(self, prompts: list[list[int]], *extra: torch.Tensor, tail: torch.Tensor | None = None
            ) -> tuple[tuple[torch.Tensor, ...], KVCache]:
        """Prefill ``prompts`` (``bucket`` must fit them) -> (``forward``'s outputs over the bucket's rows,
        the scratch rows holding them, ``lens`` set to the prompts' lengths). ``extra``: tensors of the
        bucket's shape that ``forward`` also reads (copied into the graph's inputs). ``tail``: tokens [n] on the
        device that take each prompt's last position, where the prompt holds a placeholder (the draft's anchors
        end with the target's sampled root, which the host then need not read).

        Nothing here waits for the device (``to_device``), so the host prepares the next graph while the device
        still runs the last one (on an H100 an admission's host time was about half its 3.2 ms, session 38)."""
        n = len(prompts)
        rows, length = self.bucket(n, max(map(len, prompts)))
        ids = to_device([p + [0] * (length - len(p)) for p in prompts] + [[0] * length] * (rows - n), self.device,
                        torch.long)  # [rows, length]
        last = to_device([len(p) - 1 for p in prompts] + [0] * (rows - n), self.device, torch.long)  # [rows]
        if tail is not None:
            ids[:n].scatter_(1, last[:n].unsqueeze(1), tail.view(n, 1))
        out = self.capture(rows, length)(ids, last, *extra)  # copied into the graph's inputs on the device
        view = self.scratch[rows].rows(0, n)
        view.lens.copy_(last[:n] + 1)
        return out, view

    def buckets(self, rows: int) -> list[tuple[int, int]]:
        """The (rows, length) buckets of ``rows`` rows (a power of two), one for each length that fits."""
        return [(rows, n) for n in self.lengths if self.bucket(rows, n) is not None]

    def capture(self, rows: int, length: int):
        """The bucket's step, made on its first use (``compile``: fused; ``graphs``: then captured); a server
        makes every bucket's before its first request (``serve.server.warm_prefills``)."""
        key = (rows, length)
        if key not in self.steps:
            if self.storage is None:
                self.storage = self.new_cache(1, self.max_tokens)
            if rows not in self.scratch:
                self.scratch[rows] = self.storage.reshaped(rows, self.max_tokens // rows)
            cache = self.scratch[rows]

            forward = self.fused if self.compiled and rows <= FUSED_ROWS else self.forward

            def step(ids: torch.Tensor, last: torch.Tensor, *more: torch.Tensor) -> tuple[torch.Tensor, ...]:
                cache.reset()
                return forward(ids, last, cache, *more)  # on the device (under a graph: its inputs)

            if not self.graphs:
                self.steps[key] = step
            else:
                example = (torch.zeros(rows, length, dtype=torch.long, device=self.device),
                           torch.zeros(rows, dtype=torch.long, device=self.device), *self.extra(rows, length))
                self.steps[key] = GraphedStep(step, *example, pool=self.pool)
        return self.steps[key]
