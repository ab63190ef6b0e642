"""Check 2, capture parity: does serving feed the draft what training fed it?

Two real code paths, the same tokens:

- training: the trainer's ``Featurizer`` (online: the target's forward over whole
  sequences) and, with ``--features``, the offline shards ``eaglet data capture`` wrote;
- serving: what ``SpecEngine`` handed the draft's ``fuse`` during a real speculative run
  (prefill, then each verify's accepted path; see serving.py), and for offline shards
  the engine's ``prefill`` on the shard's tokens.

Per capture point: the max absolute difference over every position both sides cover,
against a limit relative to the point's largest value (``eaglet.doctor.tp.tolerance``:
1e-4 in float32, 5e-2 in 16-bit formats). The two paths differ only in how the target's
arithmetic is batched, which moves float32 values by ~1e-6 of their size; a wrong point,
a per-rank partial sum (off by ``1 - 1/tp``, >= 0.5) or an off-by-one position is orders
of magnitude above the limit. The token embeddings and rotary positions of the draft's
anchors are compared the same way.

A mismatch is located: the serving values are matched against every point of the
training capture (a wrong point: "serving feeds point 0"), against a multiple of the
same point (a partial sum: "0.500 x point 4, as a rank's share at tp=2 would be") and
against the same point one position earlier or later.
"""

from __future__ import annotations

import torch

from eaglet.capture import CaptureSpec
from eaglet.data.features import FeatureSet
from eaglet.doctor.report import FAIL, Check
from eaglet.doctor.samples import answer_data, training_features
from eaglet.doctor.serving import ServingRun
from eaglet.doctor.tp import tolerance
from eaglet.loading.target import Target
from eaglet.speculative import verify as spec_verify
from eaglet.train.inputs import Featurizer, StepInputs

TITLE = "capture parity"


def _rows(run: ServingRun, aux: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(serving, training) features at every position serving fed: [n, k*H] each."""
    serv, train = [], []
    for b, fed in enumerate(run.fed):
        ok = ~fed[:, 0].isnan()
        serv.append(fed[ok])
        train.append(aux[b, : fed.shape[0]].float().cpu()[ok])
    return torch.cat(serv), torch.cat(train)


def _explain(s: torch.Tensor, j: int, every: dict[int, torch.Tensor], tol: float) -> str:
    """Why serving's values ``s`` [n, H] differ from training's point ``j`` (``every``: point -> [n, H])."""
    t = every[j]
    scale = max(t.abs().max().item(), 1.0)
    for p, x in every.items():
        if p != j and (s - x).abs().max().item() <= tol * max(x.abs().max().item(), 1.0):
            what = " (the embedding output)" if p == 0 else ""
            return f"serving feeds point {p}{what} where training reads point {j}"
    alpha = (s * t).sum().item() / max((t * t).sum().item(), 1e-30)
    if abs(alpha - 1) > 0.01 and (s - alpha * t).abs().max().item() <= 10 * tol * scale:
        tp = f", as one rank's share at tp={round(1 / alpha)} would be" if alpha > 0 and 1 / alpha > 1.5 else ""
        return f"serving feeds {alpha:.3f} x point {j}: a partial sum, not the full residual stream{tp}"
    for shift, word in ((1, "earlier"), (-1, "later")):
        a, b = (s[shift:], t[:-shift]) if shift > 0 else (s[:shift], t[-shift:])
        if a.numel() and (a - b).abs().max().item() <= tol * scale:
            return f"serving feeds point {j} of the position one {word}"
    return f"no other point, multiple or one-position shift of training's point {j} explains serving's values"


def _every_point(target: Target, draft, run: ServingRun) -> dict[int, torch.Tensor]:
    """Training's capture of every point 0..N at the first prompt's fed positions: point -> [n, H].

    One sequence only: all points of a large target over every prompt would not fit in memory.
    """
    n_layers, h = target.config.num_layers, target.config.hidden_size
    every = CaptureSpec(tuple(range(n_layers + 1)), n_layers)
    aux = training_features(target, every, draft, answer_data(run.prompts[:1], run.completions[:1])).aux
    fed = run.fed[0]
    rows = aux[0, : fed.shape[0]].float().cpu()[~fed[:, 0].isnan()]  # [n, (N+1)*H]
    return {p: rows[:, p * h:(p + 1) * h] for p in every.points}


def _compare(name: str, serv: torch.Tensor, train: torch.Tensor, tol: float) -> dict:
    diff = (serv - train).abs().max().item() if serv.numel() else 0.0
    scale = train.abs().max().item() if train.numel() else 0.0
    row = {"name": name, "max_abs_diff": diff, "scale": scale, "limit": tol * max(scale, 1.0),
           "positions": int(serv.shape[0])}
    row["ok"] = bool(diff <= row["limit"])  # NaN fails
    return row


def check_parity(target: Target, draft, spec: CaptureSpec, run: ServingRun, inp: StepInputs,
                 features: FeatureSet | None, num_offline: int) -> Check:
    """``inp``: the trainer's features (``spec``'s points) for the serving run's own tokens."""
    chk = Check(2, TITLE)
    h = target.config.hidden_size
    tol = tolerance(target.model.embed.weight.dtype)
    serv, train = _rows(run, inp.aux)
    rows = [_compare(f"point {p}", serv[:, i * h:(i + 1) * h], train[:, i * h:(i + 1) * h], tol)
            for i, p in enumerate(spec.points)]
    if rows[0]["positions"] == 0:
        chk.flag(FAIL, "the engine fed the draft no position the doctor could place: nothing was compared")
    if any(not r["ok"] for r in rows):
        every = _every_point(target, draft, run)
        fed = run.fed[0][~run.fed[0][:, 0].isnan()]  # the first prompt's fed positions [n, k*H]
        for i, (p, r) in enumerate(zip(spec.points, rows)):
            if not r["ok"]:
                r["explanation"] = _explain(fed[:, i * h:(i + 1) * h], p, every, tol)
                chk.flag(FAIL, f"point {p}: max |training - serving| {r['max_abs_diff']:.3g} (limit "
                               f"{r['limit']:.2g}); {r['explanation']}")
    rows += _anchor_inputs(chk, run, inp.emb, tol)
    if features is not None:
        rows += _offline(chk, target, draft, spec, features, num_offline)
    chk.evidence = {"rows": rows, "tolerance": tol}
    chk.lines.append(f"{'':22} {'max|diff|':>10} {'scale':>9} {'limit':>9} {'positions':>9}")
    for r in rows:
        chk.lines.append(f"{r['name']:22} {r['max_abs_diff']:10.2e} {r['scale']:9.2e} {r['limit']:9.2e} "
                         f"{r['positions']:9d}  {'ok' if r['ok'] else 'MISMATCH'}")
    n = rows[0]["positions"] if rows else 0
    chk.summary = (f"training and serving feed the draft the same features ({n} positions, {spec.k} points)"
                   if chk.status != FAIL else "training and serving feed the draft different features")
    return chk


def _anchor_inputs(chk: Check, run: ServingRun, emb: torch.Tensor, tol: float) -> list[dict]:
    """The token embedding and rotary position fed with each anchor: x_{t+1} at position t, as in training."""
    serv_e, train_e, bad_pos, n_pos = [], [], [], 0
    for b, (e, pos) in enumerate(zip(run.emb, run.positions)):
        n = e.shape[0]
        ok = ~e[: n - 1, 0].isnan()  # anchor t reads x_{t+1}: only t < L-1 is known
        serv_e.append(e[: n - 1][ok])
        train_e.append(emb[b, 1:n].float().cpu()[ok])
        fed = (pos >= 0).nonzero().flatten()
        n_pos += fed.numel()
        wrong = fed[pos[fed] != fed]
        if wrong.numel():
            bad_pos.append((b, int(wrong[0]), int(pos[wrong[0]])))
    row = _compare("next-token embedding", torch.cat(serv_e), torch.cat(train_e), tol)
    if not row["ok"]:
        chk.flag(FAIL, f"the token embedding fed with anchor t is not that of token t+1 as in training "
                       f"(max |diff| {row['max_abs_diff']:.3g})")
    prow = {"name": "rotary positions", "max_abs_diff": float(len(bad_pos)), "scale": 0.0, "limit": 0.0,
            "positions": n_pos, "ok": not bad_pos}
    if bad_pos:
        b, t, p = bad_pos[0]
        chk.flag(FAIL, f"anchor {t} of prompt {b} sits at rotary position {p} in serving, {t} in training")
    return [row, prow]


def _offline(chk: Check, target: Target, draft, spec: CaptureSpec, fs: FeatureSet, num: int) -> list[dict]:
    """Offline shards against the engine's prefill on the same tokens, point by point."""
    if fs.capture.k != spec.k:
        chk.flag(FAIL, f"the offline features hold {fs.capture.k} points, the draft reads {spec.k}")
        return []
    model, h = target.model, target.config.hidden_size
    dev = model.embed.weight.device
    n = min(num, len(fs))
    stored = Featurizer(target, fs.capture, draft.vocab_ids().to(dev), fs, dev)(list(range(n))).aux
    tol = tolerance(getattr(torch, fs.manifest.get("dtype", "bfloat16")))
    serv, off = [], []
    with torch.inference_mode():
        for i in range(n):
            ids = fs.get(i)["ids"].long().tolist()
            cache = model.new_cache(1, len(ids))
            _, aux = spec_verify.prefill(model, cache, [ids], spec.points)  # [1, L, k*H]
            serv.append(aux[0].float().cpu())
            off.append(stored[i, : len(ids)].float().cpu())
    serv_t, off_t = torch.cat(serv), torch.cat(off)
    rows = []
    for i, (p, q) in enumerate(zip(fs.capture.points, spec.points)):
        name = f"offline point {p}" + (f" vs {q}" if p != q else "")
        r = _compare(name, serv_t[:, i * h:(i + 1) * h], off_t[:, i * h:(i + 1) * h], tol)
        if not r["ok"]:
            chk.flag(FAIL, f"offline shards ({fs.path}) differ from the engine's prefill at {name}: max |diff| "
                           f"{r['max_abs_diff']:.3g} (limit {r['limit']:.2g})")
        rows.append(r)
    return rows
