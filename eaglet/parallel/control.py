"""A channel for rank 0's orders to the other ranks, when they may wait between orders for hours.

A long-lived job such as a server decides on rank 0 what the ranks do next (open a batch,
admit a prompt, step) and sends each order, a small picklable object, to the others
before all of them carry it out. Between orders the followers wait for as long as rank 0
is idle. The model's process group cannot carry that wait: its collectives time out
after minutes (so that a dead peer is noticed), and an NCCL collective left pending
that long is unsafe. The orders therefore travel over a gloo group of their own, on the
CPU, with a timeout of days; a rank that dies still ends the wait at once, since gloo
sees the connection close.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from eaglet.parallel.state import TPGroup

IDLE_TIMEOUT = timedelta(days=30)


class ControlChannel:
    """Rank 0 ``send``s, every other rank ``receive``s the same objects in the same order.

    Every rank of ``tp`` must construct it at the same point (it creates a group).
    """

    def __init__(self, tp: TPGroup):
        self.tp = tp
        self.group = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT) if tp.size > 1 else None

    def send(self, order: Any) -> None:
        if self.tp.rank != 0:
            raise RuntimeError("only rank 0 sends orders")
        if self.group is not None:
            dist.broadcast_object_list([order], group=self.group, group_src=0)

    def receive(self) -> Any:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        return box[0]
