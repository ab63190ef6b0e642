"""``eaglet serve``: load the target (and draft), start the scheduler, run uvicorn until SIGTERM.

SIGTERM (or Ctrl-C) stops admitting at once: waiting requests get 503, running rows
go on for ``grace_s`` seconds and are then aborted with 503, and the process exits 0.

With ``tp`` > 1 each rank loads its shard; rank 0 runs the server and the others follow
its engine calls (ranks.py). The launching process hands SIGTERM to rank 0, and the
followers ignore SIGINT and SIGTERM: rank 0 alone decides when the ranks stop.
"""

from __future__ import annotations

import gc
import signal
import sys
import time

import torch

from eaglet.errors import EagletError
from eaglet.options import DEFAULT_MAX_BATCH, ServeConfig
from eaglet.parallel.control import ControlChannel
from eaglet.parallel.launch import rank_device, run_tp, under_torchrun
from eaglet.parallel.state import SINGLE, TPGroup
from eaglet.serve.scheduler import default_batch_sizes
from eaglet.session import bucket_size


def batch_sizes(cfg: ServeConfig, graphs: bool) -> tuple[int, ...]:
    """The batch sizes the scheduler opens; under CUDA graphs the default limit is rounded to a power of two."""
    if cfg.batch_sizes:
        return tuple(sorted(cfg.batch_sizes))
    return default_batch_sizes(bucket_size(cfg.max_batch or DEFAULT_MAX_BATCH, graphs))


def load_engine(cfg: ServeConfig, tp: TPGroup = SINGLE):
    """PlainGenerator or SpecEngine on this rank's shard, as ``eaglet generate`` would build them."""
    from eaglet.generate import PlainGenerator
    from eaglet.loading import load_target
    from eaglet.speculative.load import resolve_draft, spec_engine

    def say(msg: str) -> None:
        if tp.rank == 0:
            print(f"eaglet: {msg}", file=sys.stderr)

    t = cfg.target
    if tp.size == 1:  # above, the command said so before starting the ranks
        say(f"loading {t.target} on {t.device} ({t.dtype})")
    target = load_target(t.target, dtype=t.torch_dtype, device=rank_device(t.device), tp=tp)
    draft_path = resolve_draft(cfg.draft, target)
    if draft_path is None:
        say("no draft; plain decoding")
        return PlainGenerator(target, t.max_context, compile=cfg.engine.compile,
                              compile_prefill=cfg.engine.fused_prefill(target.model.embed.weight.device))
    say(f"draft {draft_path}")
    return spec_engine(target, draft_path, t.max_context, cfg.engine)


# Prompt lengths that meet every variant of the Triton attention kernel a prefill compiles: its block
# sizes follow the length up to 128 tokens, and a length divisible by 16 is a variant of its own.
PREFILL_LENGTHS = (3, 8, 16, 24, 32, 48, 64, 96, 128)


def warm_prefills(engine, max_rows: int = 1, progress: bool = False) -> None:
    """Prefill once at each of ``PREFILL_LENGTHS`` (into a scratch cache), so the kernels a prefill compiles
    on first use are built before the first request (an H200 server's first requests waited up to 2.1 s).
    The draft's prefill and the capture run the same kernel variants as the target's. Where prefills run
    as captured graphs (``prefill.PrefillGraphs``), those of every power of two of rows up to ``max_rows``
    are captured at every length too (a burst of requests is admitted as one prefill); the eager prefill
    still serves what no graph fits. ``progress``: a bar over the graphs (a fresh H100's server spent 151-422 s
    here in session 40, silent until then)."""
    from tqdm import tqdm

    from eaglet.generate import prefill

    rows = [1 << i for i in range(max_rows.bit_length())]  # every power of two up to max_rows
    todo = [(graphs, key) for graphs in (engine.prefills, getattr(engine, "draft_prefills", None))
            if graphs is not None for r in rows for key in graphs.buckets(r)]
    for graphs, key in tqdm(todo, desc="prefill graphs", unit="graph", disable=not (progress and todo),
                            dynamic_ncols=True):
        graphs.capture(*key)
    model = engine.target.model
    cache = model.new_cache(1, max(PREFILL_LENGTHS) + 1)
    for n in PREFILL_LENGTHS:
        if n < engine.capacity:
            cache.reset()
            prefill(engine.target, cache, [[0] * n])


def warm_up(engine, cfg: ServeConfig, tp: TPGroup = SINGLE) -> None:
    """Build every batch size's compiled step now, so that no request waits for a compile; then
    ``freeze_heap``, warmed or not."""
    if engine.use_graphs if cfg.warm_up is None else cfg.warm_up:
        _build(engine, cfg, tp)
    freeze_heap()


def freeze_heap() -> None:
    """Collect once, then move every live object (the model, compiled steps and their graphs: hundreds of
    thousands of objects) to the permanent generation, which no later collection walks. Unfrozen, a full
    collection during serving walks them all, and a request waits: 0.18 s on the 2-core CPU with SmolLM2
    loaded, 0.33 s after four small compiles. SGLang and vLLM freeze after start-up too."""
    gc.collect()
    gc.freeze()


def _build(engine, cfg: ServeConfig, tp: TPGroup) -> None:
    sizes = batch_sizes(cfg, engine.use_graphs)
    t0 = time.perf_counter()
    with torch.inference_mode():
        warm_prefills(engine, sizes[-1], progress=tp.rank == 0)
    if tp.rank == 0:
        print(f"eaglet: prefills ready ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    for i, b in enumerate(sizes):
        t0 = time.perf_counter()
        engine.prepare(b)
        if tp.rank == 0:
            print(f"eaglet: batch {b} ready ({i + 1}/{len(sizes)}, {time.perf_counter() - t0:.1f} s)",
                  file=sys.stderr, flush=True)


def serve(cfg: ServeConfig) -> int:
    """The whole command: at tp=1 here; above, on ranks started here (or by torchrun)."""
    check_server_packages()
    if cfg.tp == 1 and not under_torchrun():
        engine = load_engine(cfg)
        warm_up(engine, cfg)
        return run_server(engine, cfg)
    return run_tp(cfg.tp, serve_rank, cfg, device=cfg.target.device, sigterm_to_rank0=True)


def serve_rank(tp: TPGroup, cfg: ServeConfig) -> int:
    from eaglet.interrupt import ignoring_stop_signals
    from eaglet.serve.ranks import LeadingEngine, follow

    channel = ControlChannel(tp)  # before loading: every rank creates the group at the same point
    engine = load_engine(cfg, tp)
    warm_up(engine, cfg, tp)  # every rank: the steps' collectives pair up
    if tp.rank != 0:
        with ignoring_stop_signals():
            follow(engine, channel)
        return 0
    leader = LeadingEngine(engine, channel)
    try:
        return run_server(leader, cfg)
    finally:
        leader.stop()


def check_server_packages() -> None:
    """Before the minutes of loading and warming up: the HTTP stack is importable, else one sentence."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise EagletError(f"eaglet serve needs {' and '.join(missing)}, which installing eaglet brings and this Python "
                          "lacks: reinstall eaglet (pip install -e . in a checkout)")


def run_server(engine, cfg: ServeConfig) -> int:
    import uvicorn

    from eaglet.serve.app import build_app
    from eaglet.serve.metrics import Metrics
    from eaglet.serve.scheduler import Scheduler

    metrics = Metrics()
    sizes = batch_sizes(cfg, engine.use_graphs)
    scheduler = Scheduler(engine, sizes[-1], cfg.max_queue, metrics, sizes, cfg.stream_interval,
                          cfg.overlap_handoff)
    app = build_app(engine, scheduler, metrics, engine.target.name)
    # Handlers end within the grace period (the scheduler aborts what is left); the extra
    # seconds only let their last bytes go out before uvicorn cancels them.
    server = uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning",
                                           timeout_graceful_shutdown=int(cfg.grace_s) + 5))
    uvicorn_exit = server.handle_exit

    def handle_exit(sig, frame) -> None:
        if sig == signal.SIGINT and cfg.tp > 1:
            return  # the stop comes as SIGTERM (from eaglet's launcher or torchrun); a terminal's SIGINT beside it
            # would be a second signal, which forces uvicorn out without draining
        scheduler.close(cfg.grace_s)
        uvicorn_exit(sig, frame)

    server.handle_exit = handle_exit
    # uvicorn raises the signal again after its graceful shutdown; a no-op handler lets us exit 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    print(f"eaglet: serving {engine.target.name!r} on http://{cfg.host}:{cfg.port}/v1 "
          f"(batch sizes {','.join(map(str, sizes))}, queue {cfg.max_queue})", file=sys.stderr, flush=True)
    server.run()
    scheduler.close(0)
    scheduler.join(cfg.grace_s + 5)
    print("eaglet: server stopped", file=sys.stderr)
    return 0
