"""Are the captured points and the logits under tp=N the same as under tp=1, on every rank?

This is what ``eaglet doctor --tp N`` runs. A point captured before its all-reduce (a
per-rank partial sum, the bug the seeds describe) differs from tp=1 by a large fraction
of its size and differs between ranks; a correct capture is bit-identical on every rank
and differs from tp=1 only by the rounding of a different summation order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from eaglet.capture import CaptureSpec
from eaglet.errors import EagletError
from eaglet.loading.hf import read_config
from eaglet.loading.target import build_model, load_model, resolve_target_dir
from eaglet.models.config import ModelConfig
from eaglet.parallel.launch import DEFAULT_TIMEOUT_S, rank_device, run_tp
from eaglet.parallel.state import TPGroup, broadcast_from_rank0

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


def check_shardable(cfg: ModelConfig, tp: int) -> None:
    """Raise the layers' own EagletError (heads, vocabulary, MLP width) before any rank starts.

    Builds the rank-0 model on the meta device: the shape checks run, nothing is allocated.
    """
    build_model(cfg, torch.float32, "meta", TPGroup(0, tp))


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


def across_ranks(x: torch.Tensor, tp: TPGroup) -> float:
    """max over ranks of |x on that rank - x on rank 0|; every rank gets the same number."""
    if tp.size == 1:
        return 0.0
    ref = broadcast_from_rank0(x.clone(), tp)
    worst = (x.float() - ref.float()).abs().max().reshape(1)  # [1]
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=tp.group)
    return worst.item()


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
