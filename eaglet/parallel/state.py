"""Tensor-parallel state: the process group the model layers shard over.

At tp=1 (no group) every helper here is the identity, so layers are plain layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """The ranks one model is sharded over; ``group=None`` means tp=1."""

    rank: int = 0
    size: int = 1
    group: dist.ProcessGroup | None = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate each rank's slice along the last dim (vocab-parallel logits)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


SINGLE = TPGroup()


def broadcast_from_rank0(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """Overwrite the contiguous tensor ``x`` on every rank with rank 0's copy, in place; returns ``x``.

    Decisions every rank must share (sampled tokens, accepted paths, stop flags) go
    through this. Identical logits on all ranks make them agree in practice; the
    broadcast makes it certain, even with non-deterministic kernels or sampling.
    """
    if tp.size == 1:
        return x
    # gloo has no bool type; a byte view carries the same bits.
    buf = x.view(torch.uint8) if x.dtype == torch.bool else x
    dist.broadcast(buf, group=tp.group, group_src=0)
    return x


def across_ranks(x: torch.Tensor, tp: TPGroup) -> float:
    """max over ranks of |x on that rank - x on rank 0|; every rank gets the same number."""
    if tp.size == 1:
        return 0.0
    ref = broadcast_from_rank0(x.clone(), tp)
    worst = (x.float() - ref.float()).abs().max().reshape(1)  # [1]
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=tp.group)
    return worst.item()
