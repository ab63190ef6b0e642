"""Check 3, capture-point search: would the draft do better on other points than it declares?

A draft trained on points T and served on points D != T still runs, just worse, and
nothing else in the pipeline can tell (both sides read D, so parity holds). But the
draft's weights remember T: training minimised its loss for features from T, so fed T
it predicts the target best. Candidate sets are fed to the draft, teacher-forced over
the target's own greedy answers exactly as in training, and scored at draft step 0:

- the declared set (the reference);
- the declared set shifted by -1 and by +1 (the off-by-one between "point j" and
  "output of layer i" conventions);
- the declared set with point 0 (the embedding output) in place of each point;
- EAGLE-3's default ``[2, N//2, N-3]``;
- any other set the draft's config declares (e.g. SGLang ids disagreeing with the
  eaglet block).

Scores: step-0 accuracy (the draft's argmax is the target's) and step-0 cross-entropy
(training's loss: the target's distribution against the draft's). The verdict rests on
the cross-entropy, paired per anchor, because it is the quantity training minimised and
every anchor carries evidence, not only those whose argmax flips: in a 30-layer model
neighbouring points are close, and shifting SmolLM2's points by one moved a CPU-trained
draft's accuracy by under 2 points (z < 2 over 750 anchors) but its cross-entropy by
2-3% (z = 5-9).

"Clearly beats": the candidate's mean cross-entropy is lower than the declared set's by
at least ``MARGIN`` (1%) of it and by at least ``Z`` (3) standard errors of the paired
per-anchor difference, and its accuracy is not lower. Then the check fails, naming the
set in eaglet points and SGLang ids. The margin keeps a long run from failing on a real
but negligible difference, the z-score keeps a short run from failing on noise (with ~7
candidates, z >= 3 keeps a false alarm near 1%). A lead with z >= 2 warns. When every set
scores below ``FLOOR`` accuracy the draft is untrained or belongs elsewhere and the sets
cannot be told apart: a warning, whatever the losses say (a lower loss alone never fails it).
"""

from __future__ import annotations

import math

import torch

from eaglet.capture import CaptureSpec
from eaglet.doctor.report import FAIL, WARN, Check
from eaglet.doctor.samples import select_points, step0_scores
from eaglet.errors import EagletError
from eaglet.train.inputs import StepInputs

TITLE = "capture points"
MARGIN = 0.01
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
    scores = [(label, pts, *step0_scores(draft, select_points(inp.aux, captured, pts, hidden), inp, prompt_lens))
              for label, pts in cands]
    ref_label, ref_pts, ref_hit, ref_ce = scores[0]
    n = ref_hit.numel()
    rows = []
    for label, pts, hit, ce in scores:
        d = ref_ce - ce  # [n] how much lower this set's loss is, per anchor
        se = d.std().item() / math.sqrt(n) if n > 1 else 0.0
        lead = d.mean().item() if n else 0.0
        rows.append({"label": label, "points": list(pts), "sglang_ids": _sglang(pts),
                     "acc_0": hit.float().mean().item() if n else 0.0, "ce": ce.mean().item() if n else 0.0,
                     "ce_lead": lead, "z": lead / se if se > 0 else 0.0})
    ref = rows[0]
    best = max(rows[1:], key=lambda r: r["z"], default=None)
    # Below FLOOR no set predicts the target, so a lower loss alone does not convict the declared points.
    untrained = max(r["acc_0"] for r in rows) < FLOOR
    chk.evidence = {"anchors": n, "sets": rows, "margin": MARGIN, "z": Z}
    chk.lines.append(f"{'set':18} {'eaglet points':15} {'SGLang ids':15} {'acc_0':>6} {'loss':>7} {'lower by':>8} "
                     f"{'z':>6}")
    for r in rows:
        chk.lines.append(f"{r['label']:18} {str(r['points']):15} {r['sglang_ids']:15} {r['acc_0']:6.3f} "
                         f"{r['ce']:7.3f} {r['ce_lead']:+8.3f} {r['z']:6.1f}")
    if best is not None:
        which = f"points {best['points']} (SGLang ids {best['sglang_ids']}; {best['label']})"
        numbers = (f"loss {best['ce']:.3f} vs {ref['ce']:.3f} (z={best['z']:.1f}), step-0 accuracy "
                   f"{best['acc_0']:.3f} vs {ref['acc_0']:.3f}, {n} anchors")
        if best["ce_lead"] >= MARGIN * ref["ce"] and best["z"] >= Z and best["acc_0"] >= ref["acc_0"] and not untrained:
            chk.flag(FAIL, f"the draft reads {which}, not the {ref_label} {ref['points']}: {numbers}")
        elif best["z"] >= WARN_Z:
            chk.flag(WARN, f"{which} predict the target a little better than the {ref_label} {ref['points']}: "
                           f"{numbers}")
    if untrained:
        chk.flag(WARN, f"every set scores below {FLOOR} step-0 accuracy: the draft is untrained or was trained "
                       "for another target, and the search cannot tell the sets apart")
    if chk.status == FAIL:
        chk.summary = f"the draft reads points {best['points']} best, not the {ref_label} {ref['points']}"
    elif best is not None and best["z"] >= WARN_Z:
        chk.summary = f"points {best['points']} may fit better than the {ref_label} {ref['points']} " \
                      f"(z={best['z']:.1f}, below the bar of {Z:.0f})"
    else:
        chk.summary = f"the {ref_label} points {ref['points']} fit best: acc_0 {ref['acc_0']:.3f}, loss " \
                      f"{ref['ce']:.3f} over {n} anchors"
    return chk
