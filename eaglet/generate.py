"""Plain decoding with our runtime: batched prefill, then one token per step.

This is the baseline speculative decoding must match token for token (greedy) and
beat in speed. On CUDA the decode step runs as a captured graph over the whole
cache (static shapes); on CPU it attends only over the slots in use.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from eaglet.errors import EagletError
from eaglet.loading.target import Target
from eaglet.sampling import SamplingParams


@dataclass
class Completion:
    tokens: list[int]
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    seconds: float = 0.0
    accept_lengths: list[int] = field(default_factory=list)  # per verify, speculative only

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


def context_size(target: Target, max_context: int | None) -> int:
    """The KV capacity: --max-context, else the model's window capped at 4096."""
    window = target.config.context_window
    size = min(window, 4096) if max_context is None else max_context
    if size < 2 or size > window:
        raise EagletError(f"--max-context must be between 2 and the model's window {window}, got {size}")
    return size


class StopChecker:
    """EOS ids and stop strings, per sequence."""

    def __init__(self, target: Target, params: SamplingParams):
        self.eos = set(target.config.eos_token_ids)
        if target.tokenizer is not None and target.tokenizer.eos_token_id is not None:
            self.eos.add(target.tokenizer.eos_token_id)
        self.tok = target.tokenizer
        self.stops = params.stop

    def check(self, tokens: list[int], n_new: int = 1) -> int | None:
        """How many tokens to keep if the last ``n_new`` end the sequence, else None.

        EOS is dropped; a stop string is kept up to the token that completes it.
        """
        for i in range(len(tokens) - n_new, len(tokens)):
            if tokens[i] in self.eos:
                return self._stop_in(tokens[:i]) or i
        return self._stop_in(tokens)

    def _stop_in(self, tokens: list[int]) -> int | None:
        if not self.stops or not any(s in self.tok.decode(tokens) for s in self.stops):
            return None
        for n in range(1, len(tokens) + 1):  # the shortest prefix holding a stop string
            if any(s in self.tok.decode(tokens[:n]) for s in self.stops):
                return n
        return None


def pad_batch(seqs: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, T] and lengths [B]."""
    lengths = torch.tensor([len(s) for s in seqs], device=device)
    ids = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, device=device)
    return ids, lengths


def prefill(target: Target, cache, prompts: list[list[int]]) -> torch.Tensor:
    """Right-padded batched prefill; returns each row's last-position logits [B, V]."""
    model = target.model
    dev = cache.lens.device
    ids, lengths = pad_batch(prompts, dev)
    meta = cache.append_meta(ids.shape[1])
    h, _ = model(ids, meta, cache)
    cache.advance(lengths)
    last = h[torch.arange(len(prompts), device=dev), lengths - 1]  # [B, H]
    return model.logits(last)


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
        from eaglet.cuda_graph import persistent_compile_cache

        persistent_compile_cache()
        # torch.compile's default mode: per-shape max-autotune took minutes a batch size on an H200.
        print(f"eaglet: compiling the decode step for batch {cache.batch} (first use at this batch size)",
              file=sys.stderr)
        step = torch.compile(step, fullgraph=True, dynamic=False)
    if not graph:
        return step
    from eaglet.cuda_graph import GraphedStep

    return GraphedStep(step, torch.zeros(cache.batch, 1, dtype=torch.long, device=cache.lens.device))


class PlainGenerator:
    def __init__(self, target: Target, max_context: int | None = None, use_graphs: bool | None = None,
                 compile: bool | None = None):
        self.target = target
        self.capacity = context_size(target, max_context)
        self.device = target.model.embed.weight.device
        on_cuda = self.device.type == "cuda"
        self.use_graphs = on_cuda if use_graphs is None else use_graphs
        # Fusion (torch.compile) is what takes a small model's step from launch-bound
        # toward the bandwidth floor; on CPU its start-up cost outweighs the gain.
        self.compile = on_cuda if compile is None else compile
        self._graphs: dict[int, object] = {}
        self._caches: dict[int, object] = {}

    def _cache(self, batch: int):
        if batch not in self._caches:
            self._caches[batch] = self.target.model.new_cache(batch, self.capacity)
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

    @torch.inference_mode()
    def prepare(self, batch: int) -> None:
        """Build (compile, capture) the step of ``batch`` rows now rather than at its first use."""
        self._step_fn(self._cache(batch))

    def session(self, batch: int, params: SamplingParams, own_draws: bool = False):
        """A running batch of ``batch`` rows (one live session per batch size: they share a cache);
        ``own_draws``: each row samples from a generator of its own (``Session``)."""
        from eaglet.session import Session

        cache = self._cache(batch)
        return Session(self.target, cache, self._step_fn(cache), params, self.capacity, own_draws=own_draws)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 on_token: Callable[[int, int], None] | None = None) -> list[Completion]:
        """Decode each prompt; ``on_token(row, token)`` streams tokens as they are final."""
        from eaglet.session import bucket_size, decode_all

        return decode_all(self.session(bucket_size(len(prompts), self.use_graphs), params), prompts, params,
                          on_token)
