"""``eaglet serve``: the OpenAI-compatible server (serve/); under ``--tp N`` rank 0 serves and the
other ranks follow its engine calls (serve/ranks.py)."""

from __future__ import annotations

from eaglet.commands.common import prepare, tp_job
from eaglet.options import ServeConfig


def run(opts: ServeConfig) -> int:
    from eaglet.serve.server import serve

    if tp_job(opts.tp):
        prepare(opts.target, opts.tp)
    return serve(opts)
