"""Capture a fixed-shape step (decode, draft step, verify) into a CUDA graph and replay it.

The step reads its inputs from static buffers and the KV cache (whose ``lens`` is a
device tensor), so one capture serves every later call at the same shapes. Launch
overhead, not bandwidth, bounds a small model's step, and replay removes it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch


def persistent_compile_cache() -> None:
    """Keep torch.compile's artifacts under eaglet's cache, so a later process reuses them.

    torch's FX graph and autograd caches are on by default but live in /tmp; an explicit
    TORCHINDUCTOR_CACHE_DIR wins. Called before the first compile.
    """
    from eaglet.loading.target import cache_root

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))


# Compiles of one function eaglet allows in a process. Each is deliberate (a shape: batch size, tree,
# sampling rule, cache size), and dynamo's default of 8 per function failed the ninth (fullgraph): a
# server's batch sizes (seven up to --max-batch 64) plus sampling rules, or one training run's stages.
RECOMPILE_LIMIT = 1024

# (what, seconds) of every first call of a compiled step in this process, in order: ``bench`` reports them.
COMPILES: list[tuple[str, float]] = []


def compiled(fn: Callable, what: str, **options) -> Callable:
    """``torch.compile(fn, **options)``, saying on stderr what compiles and, after its first call (where
    torch compiles), how long that took: on a GPU the first use of a batch size costs minutes, and whoever
    waits should see which step they go to."""
    persistent_compile_cache()
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)
    print(f"eaglet: compiling {what} (first use at this batch size)", file=sys.stderr)
    fn = torch.compile(fn, **options)
    first = True

    def call(*args):
        nonlocal first
        if not first:
            return fn(*args)
        first = False
        t0 = time.perf_counter()
        out = fn(*args)
        seconds = time.perf_counter() - t0
        COMPILES.append((what, round(seconds, 2)))
        print(f"eaglet: compiled {what} in {seconds:.1f} s", file=sys.stderr)
        return out

    return call


@contextmanager
def idle(active: torch.Tensor, *state: torch.Tensor):
    """Every row inactive (``active`` zeroed), so a step run inside commits nothing; ``active`` and the
    ``state`` it rewrites are restored after. Warm-up and capture run a step for real, and so do timings."""
    saved = [t.clone() for t in (active, *state)]
    active.zero_()
    try:
        yield
    finally:
        for t, v in zip((active, *state), saved):
            t.copy_(v)


class GraphedStep:
    def __init__(self, fn: Callable[..., torch.Tensor], *example: torch.Tensor, warmup: int = 2, pool=None):
        """``pool``: a memory pool shared with graphs that never run at the same time (``graph_pool_handle``)."""
        self.inputs = [x.clone() for x in example]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):  # compile / autotune outside the capture
                fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.output = fn(*self.inputs)

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        for dst, src in zip(self.inputs, args):
            dst.copy_(src)
        self.graph.replay()
        return self.output
