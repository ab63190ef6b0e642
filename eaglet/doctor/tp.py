"""Check 6, tensor parallelism (``--tp N``): are the draft's points complete on every rank?

Runs ``eaglet.parallel.check.compare_tp``: the target at tp=N (one process per rank) and
at tp=1 on the same prompts; each captured point and the logits must agree across ranks
and with tp=1 within ``tolerance(dtype)`` of their size. A point captured before its
all-reduce (a per-rank partial sum) is off by ``1 - 1/N`` of its size and differs
between ranks.
"""

from __future__ import annotations

import torch

from eaglet.doctor.report import FAIL, Check, skipped
from eaglet.errors import EagletError
from eaglet.parallel.check import compare_tp

TITLE = "tensor parallel"
PROMPT_TOKENS = 64  # per prompt: enough positions, little time (tp ranks share the machine)


def check_tp(target: str, tp: int | None, prompts: list[list[int]], points: tuple[int, ...] | None,
             dtype: torch.dtype, device: str, timeout_s: float) -> Check:
    if tp is None or tp == 1:
        return skipped(6, TITLE, "not asked (--tp N compares the target at tp=N with tp=1)")
    chk = Check(6, TITLE)
    short = [p[:PROMPT_TOKENS] for p in prompts[:2]]
    try:
        rep = compare_tp(target, tp, short, points, dtype=dtype, device=device, timeout_s=timeout_s)
    except EagletError as e:
        chk.flag(FAIL, f"tp={tp}: {e}")
        chk.summary = f"the target does not run at tp={tp}"
        return chk
    for d in rep.diffs:
        if not d.ok:
            share = d.vs_tp1 / max(d.scale, 1e-30)
            hint = f"; off by {share:.2f} of its size, as a per-rank partial sum (1 - 1/{tp}) would be" \
                if abs(share - (1 - 1 / tp)) < 0.1 else ""
            chk.flag(FAIL, f"{d.name} differs at tp={tp}{_layer_of(d.name)}: across ranks {d.across_ranks:.3g}, "
                           f"from tp=1 {d.vs_tp1:.3g} (limit {d.limit:.2g}){hint}")
    chk.lines = rep.format().splitlines()[1:]
    chk.evidence = {"tp": tp, "dtype": rep.dtype, "tokens": rep.tokens,
                    "diffs": [{"name": d.name, "across_ranks": d.across_ranks, "vs_tp1": d.vs_tp1,
                               "scale": d.scale, "limit": d.limit, "ok": d.ok} for d in rep.diffs]}
    chk.summary = (f"tp={tp} matches tp=1 at every point and the logits ({rep.tokens} positions)"
                   if rep.ok else f"tp={tp} differs from tp=1")
    return chk


def _layer_of(name: str) -> str:
    """Which layer to suspect for a bad point: point j is the output of layer j - 1."""
    if not name.startswith("point "):
        return ""
    j = int(name.split()[1])
    what = "the embedding output" if j == 0 else f"the output of layer {j - 1}"
    return f" ({what}: an all-reduce there is missing or deferred past the capture)"
