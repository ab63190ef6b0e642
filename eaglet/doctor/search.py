"""Check 3, capture-point search: would the draft do better on other points than it declares?

A draft trained on points T and served on points D != T still runs, just badly, and
nothing else in the pipeline can tell (both sides read D, so parity holds). But the
draft's weights remember T: its step-0 accuracy against the target is highest when fed
T. So candidate sets are fed to the draft, teacher-forced over the target's own greedy
answers, and scored by step-0 accuracy (the draft's argmax = the target's argmax):

- the declared set (the reference);
- the declared set shifted by -1 and by +1 (the off-by-one between "point j" and
  "output of layer i" conventions);
- the declared set with point 0 (the embedding output) in place of each point;
- EAGLE-3's default ``[2, N//2, N-3]``;
- any other set the draft's config declares (e.g. SGLang ids disagreeing with the
  eaglet block).

"Clearly beats": on the same anchors, a candidate's accuracy exceeds the declared set's
by at least ``MARGIN`` (3 points) and by at least ``Z`` (3) paired standard errors. With
``b``/``c`` anchors right only under the declared set / only under the candidate, the
difference is ``(c - b) / n`` and its standard error ``sqrt(b + c) / n`` (McNemar's
test). The check fails then, naming the set in eaglet points and SGLang ids. A
smaller but still significant (2 standard errors) lead is a warning. When every set
scores below ``FLOOR`` the draft is untrained or belongs elsewhere, and the search
cannot tell anything apart: a warning.
"""

from __future__ import annotations

import math

import torch

from eaglet.capture import CaptureSpec
from eaglet.doctor.report import FAIL, WARN, Check
from eaglet.doctor.samples import select_points, step_hits
from eaglet.errors import EagletError
from eaglet.train.inputs import StepInputs

TITLE = "capture points"
MARGIN = 0.03
Z = 3.0
WARN_Z = 2.0
FLOOR = 0.05


def candidates(reference: CaptureSpec, reference_label: str,
               alternatives: list[tuple[str, CaptureSpec]]) -> list[tuple[str, tuple[int, ...]]]:
    """(label, points) of every valid candidate, the reference first, without repeats."""
    n, pts = reference.num_layers, reference.points
    raw = [(reference_label, pts), ("declared -1", tuple(p - 1 for p in pts)),
           ("declared +1", tuple(p + 1 for p in pts))]
    raw += [(f"point 0 for {p}", pts[:i] + (0,) + pts[i + 1:]) for i, p in enumerate(pts) if p != 0]
    try:
        raw.append(("EAGLE-3 default", CaptureSpec.eagle3_default(n).points))
    except EagletError:  # too shallow a target for three distinct points
        pass
    raw += [(label, s.points) for label, s in alternatives]
    out, seen = [], set()
    for label, p in raw:
        if p in seen or len(set(p)) != len(p) or not all(0 <= x <= n for x in p) or len(p) != len(pts):
            continue
        seen.add(p)
        out.append((label, p))
    return out


def needed_points(cands: list[tuple[str, tuple[int, ...]]]) -> tuple[int, ...]:
    return tuple(sorted({p for _, pts in cands for p in pts}))


def _sglang(points: tuple[int, ...]) -> str:
    return str([p - 1 for p in points]) if 0 not in points else "-"


def check_search(draft, inp: StepInputs, captured: tuple[int, ...], hidden: int, prompt_lens: torch.Tensor,
                 cands: list[tuple[str, tuple[int, ...]]]) -> Check:
    """``inp.aux`` holds the points ``captured`` (all candidates' points); ``cands[0]`` is the reference."""
    chk = Check(3, TITLE)
    scores = []
    for label, pts in cands:
        hits = step_hits(draft, select_points(inp.aux, captured, pts, hidden), inp, prompt_lens, 1)[0]
        scores.append((label, pts, hits))
    ref_label, ref_pts, ref = scores[0]
    n = ref.numel()
    rows = []
    for label, pts, hits in scores:
        b = int((ref & ~hits).sum())  # right only under the reference
        c = int((hits & ~ref).sum())  # right only under this set
        diff = (c - b) / max(n, 1)
        se = math.sqrt(b + c) / max(n, 1)
        z = diff / se if se > 0 else 0.0
        rows.append({"label": label, "points": list(pts), "sglang_ids": _sglang(pts),
                     "acc_0": float(hits.float().mean()) if n else 0.0, "diff": diff, "z": z})
    ref_acc = rows[0]["acc_0"]
    best = max(rows[1:], key=lambda r: r["acc_0"], default=None)
    chk.evidence = {"anchors": n, "sets": rows, "margin": MARGIN, "z": Z}
    chk.lines.append(f"{'set':22} {'eaglet points':16} {'SGLang ids':16} {'acc_0':>6} {'vs ref':>7} {'z':>5}")
    for r in rows:
        chk.lines.append(f"{r['label']:22} {str(r['points']):16} {r['sglang_ids']:16} {r['acc_0']:6.3f} "
                         f"{r['diff']:+7.3f} {r['z']:5.1f}")
    if best is not None and best["diff"] >= MARGIN and best["z"] >= Z:
        chk.flag(FAIL, f"the draft reads points {best['points']} (SGLang ids {best['sglang_ids']}; {best['label']}), "
                       f"not the {ref_label} {list(ref_pts)}: step-0 accuracy {best['acc_0']:.3f} vs {ref_acc:.3f} "
                       f"(+{best['diff']:.3f}, z={best['z']:.1f}, {n} anchors)")
    elif best is not None and best["diff"] > 0 and best["z"] >= WARN_Z:
        chk.flag(WARN, f"points {best['points']} ({best['label']}) score {best['acc_0']:.3f} against {ref_acc:.3f} "
                       f"for the {ref_label} set: a lead of {best['diff']:+.3f} (z={best['z']:.1f}), "
                       f"below the {MARGIN} / z={Z:.0f} bar")
    if max(r["acc_0"] for r in rows) < FLOOR:
        chk.flag(WARN, f"every set scores below {FLOOR} step-0 accuracy: the draft is untrained or was trained "
                       "for another target, and the search cannot tell the sets apart")
    if chk.status == FAIL:
        chk.summary = f"the draft reads points {best['points']} best, not the {ref_label} {list(ref_pts)}"
    else:
        lead = f"; best other {best['points']} {best['acc_0']:.3f}" if best is not None else ""
        chk.summary = f"{ref_label} points {list(ref_pts)} score best: acc_0 {ref_acc:.3f} over {n} anchors{lead}"
    return chk
