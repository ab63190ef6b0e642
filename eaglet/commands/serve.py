"""``eaglet serve``: the OpenAI-compatible server (serve/)."""

from __future__ import annotations

from eaglet.options import ServeConfig


def run(opts: ServeConfig) -> int:
    from eaglet.serve.server import serve

    return serve(opts)
