"""``eaglet serve``: load the target (and draft), start the scheduler, run uvicorn until SIGTERM.

SIGTERM (or Ctrl-C) stops admitting at once: waiting requests get 503, running rows
go on for ``grace_s`` seconds and are then aborted with 503, and the process exits 0.
"""

from __future__ import annotations

import signal
import sys

from eaglet.options import ServeConfig


def load_engine(cfg: ServeConfig):
    """PlainGenerator or SpecEngine, as ``eaglet generate`` would build them."""
    from eaglet.generate import PlainGenerator
    from eaglet.loading import load_target
    from eaglet.speculative.load import resolve_draft, spec_engine

    t = cfg.target
    print(f"eaglet: loading {t.target} on {t.device} ({t.dtype})", file=sys.stderr)
    target = load_target(t.target, dtype=t.torch_dtype, device=t.device)
    draft_path = resolve_draft(cfg.draft, target)
    if draft_path is None:
        print("eaglet: no draft; plain decoding", file=sys.stderr)
        return PlainGenerator(target, t.max_context, compile=cfg.engine.compile)
    print(f"eaglet: draft {draft_path}", file=sys.stderr)
    return spec_engine(target, draft_path, t.max_context, cfg.engine)


def serve(cfg: ServeConfig) -> int:
    import uvicorn

    from eaglet.serve.app import build_app
    from eaglet.serve.metrics import Metrics
    from eaglet.serve.scheduler import Scheduler
    from eaglet.session import bucket_size

    engine = load_engine(cfg)
    metrics = Metrics()
    scheduler = Scheduler(engine, bucket_size(cfg.max_batch, engine.use_graphs), cfg.max_queue, metrics)
    app = build_app(engine, scheduler, metrics, engine.target.name)
    # Handlers end within the grace period (the scheduler aborts what is left); the extra
    # seconds only let their last bytes go out before uvicorn cancels them.
    server = uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning",
                                           timeout_graceful_shutdown=int(cfg.grace_s) + 5))
    uvicorn_exit = server.handle_exit

    def handle_exit(sig, frame) -> None:
        scheduler.close(cfg.grace_s)
        uvicorn_exit(sig, frame)

    server.handle_exit = handle_exit
    # uvicorn raises the signal again after its graceful shutdown; a no-op handler lets us exit 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    print(f"eaglet: serving {engine.target.name!r} on http://{cfg.host}:{cfg.port}/v1 "
          f"(batch {scheduler.max_batch}, queue {cfg.max_queue})", file=sys.stderr, flush=True)
    server.run()
    scheduler.close(0)
    scheduler.join(cfg.grace_s + 5)
    print("eaglet: server stopped", file=sys.stderr)
    return 0
