"""Check 6, tensor parallelism (``--tp N``): are the draft's points complete on every rank?

``compare_tp`` runs the target at tp=N (one process per rank) and at tp=1 on the same
prompts; each captured point and the logits must agree across ranks and with tp=1 within
``tolerance(dtype)`` of their size. A point captured before its all-reduce (a per-rank
partial sum, the bug the seeds describe) differs from tp=1 by ``1 - 1/N`` of its size and
differs between ranks; a correct capture is bit-identical on every rank and differs from
tp=1 only by the rounding of a different summation order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from eaglet.capture import CaptureSpec
from eaglet.doctor.report import FAIL, Check, skipped
from eaglet.errors import EagletError
from eaglet.loading.hf import read_config
from eaglet.loading.target import check_shardable, load_model, resolve_target_dir
from eaglet.parallel.launch import DEFAULT_TIMEOUT_S, rank_device, run_tp
from eaglet.parallel.state import TPGroup, across_ranks

TITLE = "tensor parallel"
PROMPT_TOKENS = 64  # per prompt: enough positions, little time (tp ranks share the machine)
LOGITS = "logits"


def tolerance(dtype: torch.dtype) -> float:
    """Allowed max difference, relative to the tensor's largest value.

    A partial sum at tp=N is off by (1 - 1/N) of the value, >= 0.5: far above both.
    """
    return 1e-4 if dtype in (torch.float32, torch.float64) else 5e-2


@dataclass(frozen=True)
class Diff:
    name: str  # "point j" or "logits"
    across_ranks: float  # max |rank r - rank 0| over ranks, tokens and features
    vs_tp1: float  # max |tp=N - tp=1|
    scale: float  # max |tp=1 value|: the tolerance is relative to it
    rel_tol: float

    @property
    def limit(self) -> float:
        return self.rel_tol * max(self.scale, 1.0)

    @property
    def ok(self) -> bool:
        # Written so that NaN fails: every comparison with NaN is False.
        return self.across_ranks <= self.limit and self.vs_tp1 <= self.limit


@dataclass(frozen=True)
class TPReport:
    target: str
    tp: int
    dtype: str
    tokens: int  # positions compared (all prompts together)
    diffs: tuple[Diff, ...]

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.diffs)

    def format(self) -> str:
        head = f"{self.target}: tp={self.tp} against tp=1, {self.dtype}, {self.tokens} token positions"
        rows = [f"  {'':10} {'across ranks':>12} {'vs tp=1':>10} {'limit':>10}"]
        for d in self.diffs:
            verdict = "ok" if d.ok else "MISMATCH"
            rows.append(f"  {d.name:10} {d.across_ranks:12.3e} {d.vs_tp1:10.3e} {d.limit:10.3e}  {verdict}")
        return "\n".join([head, *rows])


def judge(name: str, got: torch.Tensor, ref: torch.Tensor, across_ranks: float = 0.0,
          rel_tol: float = 1e-4) -> Diff:
    """Compare one tensor from tp=N (``got``) with its tp=1 reference."""
    if got.shape != ref.shape:
        raise EagletError(f"{name} has shape {tuple(got.shape)} under tp but {tuple(ref.shape)} at tp=1")
    got, ref = got.float(), ref.float()
    return Diff(name, across_ranks, (got - ref).abs().max().item(), ref.abs().max().item(), rel_tol)


def point_name(j: int) -> str:
    return f"point {j}"


@torch.inference_mode()
def forward_outputs(model: nn.Module, prompts: list[list[int]], points: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """Each captured point and the logits, prompts one at a time (no padding to get wrong).

    Returns name -> [sum of prompt lengths, H or V] on the model's device.
    """
    device = model.embed.weight.device
    hidden = model.cfg.hidden_size
    parts: dict[str, list[torch.Tensor]] = {}
    for p in prompts:
        h, aux = model(torch.tensor([p], device=device), capture=points)  # h [1, T, H], aux [1, T, k*H]
        for j, x in zip(points, aux[0].split(hidden, dim=-1), strict=True):
            parts.setdefault(point_name(j), []).append(x)  # [T, H]
        parts.setdefault(LOGITS, []).append(model.logits(h[0]))  # [T, V]
    return {name: torch.cat(xs) for name, xs in parts.items()}


def _on_rank(tp: TPGroup, path: Path, prompts: list[list[int]], points: tuple[int, ...],
             dtype: torch.dtype, device: str) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    model = load_model(path, dtype, rank_device(device), tp)
    outs = forward_outputs(model, prompts, points)
    across = {name: across_ranks(x, tp) for name, x in outs.items()}
    return {name: x.float().cpu() for name, x in outs.items()}, across


def compare_tp(target: str, tp: int, prompts: list[list[int]], points: tuple[int, ...] | None = None, *,
               dtype: torch.dtype = torch.float32, device: str = "cpu",
               timeout_s: float = DEFAULT_TIMEOUT_S) -> TPReport:
    """Run ``target`` at tp=``tp`` and at tp=1 on the same prompts and compare.

    ``target`` is anything ``load_target`` accepts; ``points`` default to all of
    0..N. The tp=1 reference is loaded after the ranks have finished, so a device
    holds one copy of the model at a time.
    """
    if not prompts or not all(prompts):
        raise EagletError("the TP check needs at least one prompt, and no empty prompt")
    path = resolve_target_dir(target)  # here, once: ranks must not race to convert a GGUF
    cfg = read_config(path)
    check_shardable(cfg, tp)
    n_layers = cfg.num_layers
    points = CaptureSpec(tuple(points) if points is not None else tuple(range(n_layers + 1)), n_layers).points
    outs, across = run_tp(tp, _on_rank, path, prompts, points, dtype, device, device=device, timeout_s=timeout_s)
    ref = forward_outputs(load_model(path, dtype, rank_device(device)), prompts, points)
    tol = tolerance(dtype)
    diffs = tuple(judge(name, outs[name], x.cpu(), across[name], tol) for name, x in ref.items())
    return TPReport(target, tp, str(dtype).removeprefix("torch."), sum(map(len, prompts)), diffs)


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
