"""The follower ranks of `eaglet serve --tp N` repeat rank 0's engine calls, a batch growing in place
included (in one process: two unsharded engines and a queue for the control channel)."""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import torch

from eaglet.sampling import SamplingParams
from eaglet.serve.ranks import LeadingEngine, follow
from tests.serve.conftest import new_engine


class _Channel:
    def __init__(self):
        self.tp, self.q = SimpleNamespace(rank=1), queue.Queue()

    def send(self, order) -> None:
        self.q.put(order)

    def receive(self):
        return self.q.get(timeout=60)


def test_followers_grow_the_batch_as_rank0_does(served_dirs, one_thread):
    channel, params = _Channel(), SamplingParams(max_new_tokens=12)
    lead, other = new_engine(served_dirs, adaptive=False), new_engine(served_dirs, adaptive=False)
    done = {}
    follower = threading.Thread(target=lambda: done.update(orders=follow(other, channel)))
    follower.start()
    engine = LeadingEngine(lead, channel)
    with torch.inference_mode():
        s = engine.session(1, params)
        s.admit(0, [[5, 6, 7, 8]], params)
        s.step()
        s = engine.grow(s, 4)
        s.admit([1, 2], [[9, 10, 11], [12, 13]], params)
        while s.running():
            s.step()
    engine.stop()
    follower.join(60)
    assert done["orders"] > 5
    mine, theirs = lead._caches[4][0], other._caches[4][0]  # the target caches of batch 4 on both "ranks"
    assert mine.lens[:3].tolist() == theirs.lens[:3].tolist() and min(mine.lens[:3].tolist()) > 2
    for a, b in zip(mine.k, theirs.k):
        assert all(torch.equal(a[r, :, :n], b[r, :, :n]) for r, n in enumerate(mine.lens[:3].tolist()))
