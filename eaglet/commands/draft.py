"""``eaglet draft import``: another tool's EAGLE-3 draft rewritten with explicit capture points."""

from __future__ import annotations

import json

from eaglet.commands.common import load
from eaglet.train_options import DraftImportOptions


def import_(opts: DraftImportOptions) -> int:
    from eaglet.draft.compat import import_draft
    from eaglet.train.dist import init_distributed

    target = load(opts.target, init_distributed(opts.target.device).device)
    spec = import_draft(opts.src, opts.out, target, list(opts.capture_ids) if opts.capture_ids else None,
                        opts.convention, overwrite=opts.overwrite)
    print(json.dumps({"out": opts.out, "capture_points": list(spec.points), "convention": "eaglet"}))
    return 0
