"""Rank 0 drives, the other ranks mirror: single-process code on a tensor-parallel target.

Feature capture and draft training are written for one process: they choose batches,
skip finished shards, keep time budgets, train the draft and write files. Under tensor
parallelism that code runs on rank 0 only, against a ``Leader`` standing in for the
target model. Each target call it makes (a whole-sequence forward with capture,
logits, the embedding, LM-head rows) is first announced to the other ranks, which sit
in ``follow`` and make the same call on their shard, so the collectives inside the
sharded layers pair up. The followers need no data, no clock and no files: rank 0
alone decides what runs and when to stop, so nothing time- or file-dependent can send
the ranks down different paths.

Per call: one header broadcast ``[op, dtype, ndim, d0, d1, d2, d3, n_capture]``, the
capture points if any, then the input tensor. ``LAST_LOGITS`` (logits of the hidden
states the previous forward returned) sends no tensor: every rank still holds them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from eaglet.parallel.state import TPGroup, broadcast_from_rank0

STOP, FORWARD, LOGITS, LAST_LOGITS, EMBED, HEAD_ROWS = range(6)
DTYPES = (torch.long, torch.int32, torch.float32, torch.bfloat16, torch.float16)
MAX_DIMS = 4
HEADER = 4 + MAX_DIMS


def _apply(model: nn.Module, op: int, x: torch.Tensor | None, capture: tuple[int, ...]) -> Any:
    if op == FORWARD:
        return model(x, capture=capture)  # (hidden [B, T, H], aux [B, T, k*H] or None)
    if op in (LOGITS, LAST_LOGITS):
        return model.logits(x)  # [..., V]
    if op == EMBED:
        return model.embed(x)  # [B, T, H]
    if op == HEAD_ROWS:
        return model.head_rows(x)  # [n, H]
    raise ValueError(f"unknown mirrored op {op}")


def _header(tp: TPGroup, device: torch.device, op: int, x: torch.Tensor | None = None,
            capture: tuple[int, ...] = ()) -> None:
    head = torch.zeros(HEADER, dtype=torch.long)
    head[0] = op
    if x is not None:
        if x.dim() > MAX_DIMS or x.dtype not in DTYPES:
            raise TypeError(f"cannot mirror a {x.dim()}-d {x.dtype} tensor")
        head[1], head[2] = DTYPES.index(x.dtype), x.dim()
        head[3: 3 + x.dim()] = torch.tensor(x.shape)
    head[-1] = len(capture)
    broadcast_from_rank0(head.to(device), tp)
    if capture:
        broadcast_from_rank0(torch.tensor(capture, dtype=torch.long, device=device), tp)
    if x is not None:
        broadcast_from_rank0(x.contiguous(), tp)


class _Announced:
    """``leader.embed``: calling it is mirrored; attributes (``.weight``) are the local module's."""

    def __init__(self, leader: Leader, op: int, module: nn.Module):
        self._leader, self._op, self._module = leader, op, module

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._leader._run(self._op, x)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


class Leader:
    """Rank 0's stand-in for a sharded ``Transformer``: the same calls, announced to the followers.

    Only whole sequences (no KV cache) are mirrored; every other attribute (``cfg``,
    ``tp``, ``norm``, ...) is the local model's.
    """

    def __init__(self, model: nn.Module, tp: TPGroup):
        self.model, self.tp = model, tp
        self.device = model.embed.weight.device
        self.embed = _Announced(self, EMBED, model.embed)
        self.busy = False  # between an announcement and the end of its call: the ranks are mid-collective
        self._last_hidden: torch.Tensor | None = None

    def __getattr__(self, name: str) -> Any:
        if name == "model":  # not yet set (unpickling, copying): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)

    def __call__(self, ids: torch.Tensor, meta=None, cache=None, capture: tuple[int, ...] = ()):
        if meta is not None or cache is not None:
            raise TypeError("a mirrored target runs whole sequences only (no KV cache)")
        hidden, aux = self._run(FORWARD, ids, tuple(int(j) for j in capture))
        self._last_hidden = hidden
        return hidden, aux

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        if h is self._last_hidden:
            return self._run(LAST_LOGITS, h, send=False)
        return self._run(LOGITS, h)

    def head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self._run(HEAD_ROWS, ids)

    def stop(self) -> None:
        _header(self.tp, self.device, STOP)

    def _run(self, op: int, x: torch.Tensor, capture: tuple[int, ...] = (), send: bool = True) -> Any:
        self.busy = True
        _header(self.tp, self.device, op, x if send else None, capture)
        out = _apply(self.model, op, x, capture)
        self.busy = False
        return out


@contextmanager
def leading(model: nn.Module, tp: TPGroup) -> Iterator[Leader]:
    """Rank 0's side: a ``Leader``, and STOP for the followers at the end.

    On an error between calls the followers are stopped too, so they exit cleanly and
    rank 0's error is the one reported. On an error inside a call they are mid-collective
    and cannot be told; the launcher ends them (``run_tp``) or the collective timeout does
    (torchrun).
    """
    leader = Leader(model, tp)
    try:
        yield leader
    finally:
        if not leader.busy:
            leader.stop()


@torch.inference_mode()
def follow(model: nn.Module, tp: TPGroup) -> int:
    """The other ranks' side: make rank 0's announced calls on this shard until STOP; returns how many."""
    device = model.embed.weight.device
    calls, last_hidden = 0, None
    while True:
        head = broadcast_from_rank0(torch.zeros(HEADER, dtype=torch.long, device=device), tp).tolist()
        op, dtype, ndim, n_capture = head[0], DTYPES[head[1]], head[2], head[-1]
        if op == STOP:
            return calls
        capture = ()
        if n_capture:
            points = broadcast_from_rank0(torch.zeros(n_capture, dtype=torch.long, device=device), tp)
            capture = tuple(points.tolist())
        if op == LAST_LOGITS:
            x = last_hidden
        else:
            x = broadcast_from_rank0(torch.empty(head[3: 3 + ndim], dtype=dtype, device=device), tp)
        out = _apply(model, op, x, capture)
        if op == FORWARD:
            last_hidden = out[0]
        calls += 1
