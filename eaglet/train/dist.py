"""Data parallelism through torchrun with no code change.

When torchrun sets ``WORLD_SIZE`` > 1, every rank joins one process group (NCCL on CUDA,
gloo on CPU), takes its own GPU (``LOCAL_RANK``) and its own share of the batches; the
draft is wrapped in DistributedDataParallel, which averages gradients. Rank 0 alone
writes logs, checkpoints and the exported draft.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from eaglet.errors import EagletError
from eaglet.parallel.launch import leave_group


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


SINGLE_PROCESS = DistInfo()


def init_distributed(device: str | None) -> DistInfo:
    """Join torchrun's process group when WORLD_SIZE > 1; pick this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    want = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise EagletError("--device cuda was asked for but no CUDA device is available")
    if world <= 1:
        return DistInfo(device=torch.device(want))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if want.startswith("cuda"):
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
        # A rank that exits with the group still up while its peer is exporting has been seen
        # to abort under load (gloo: "terminate called without an active exception").
        atexit.register(leave_group, True)
    return DistInfo(rank, world, dev)


def all_sum(x: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(x)
    return x


def any_rank(flag: bool, info: DistInfo) -> bool:
    """True on every rank when it is True on any (a shared decision to stop)."""
    if not info.enabled:
        return flag
    t = torch.tensor([float(flag)], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()
