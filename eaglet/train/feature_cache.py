"""The target's features of each conversation kept in memory after their first pass, so that later epochs
(and every validation after the first) skip the frozen target's forward.

What a step reads from the target, its captured points [T, k*H] and final hidden state [T, H], depends on the
conversation alone (the target is frozen; under right padding a row's positions see only its own tokens, up to
the rounding of GEMMs of another batch shape), yet online training recomputed them every epoch: the target's
forward was 41 of the H200's 151 ms a step of 16k tokens in session 16's profile (docs/training.md). In bf16 a
token takes (k + 1) * H * 2 bytes (SmolLM2: 4.6 KB, so 13M training tokens take 60 GB): an H200 holds a
one-command run's features beside training; a smaller card keeps the conversations that fit, first come
first kept, and recomputes the others. Rows are stored as the online forward made them, cut at their length.
"""

from __future__ import annotations

import os

import torch

# Kept free for training itself beside the cache: the H200's step of 16k tokens peaked at 18.9 GiB
# (scripts/train_step_profile.py, session 17), the optimizer's states and the allocator's slack on top. 24 GiB
# ran an H100 out of memory at the second step (session 33); the H200's 27.8 (its 20% share) has held.
HEADROOM_BYTES = 32 << 30
HEADROOM_SHARE = 0.2  # of the device's memory, where that is more
CPU_SHARE = 0.25  # of the host's free memory, on a CPU (where the cache is off unless asked for)


class FeatureCache:
    """Captured points and hidden states by conversation index, in one buffer of ``capacity`` tokens (allocated
    at the first ``put``)."""

    def __init__(self, aux_width: int, hidden_width: int, capacity: int, dtype: torch.dtype | None = None):
        self.aux_width, self.width, self.capacity = aux_width, aux_width + hidden_width, capacity
        self.dtype = dtype  # of the buffer (the features are cast to it); None: the first features'
        self.buf: torch.Tensor | None = None  # [capacity, k*H + H]
        self.spans: dict[int, tuple[int, int]] = {}  # conversation -> (first token, tokens)
        self.used = 0

    def __contains__(self, i: int) -> bool:
        return i in self.spans

    def put(self, i: int, aux: torch.Tensor, hidden: torch.Tensor) -> None:
        """Keep conversation ``i``'s aux [n, k*H] and hidden [n, H] if it is new and fits."""
        n = aux.shape[0]
        if i in self.spans or self.used + n > self.capacity:
            return
        if self.buf is None:
            self.buf = aux.new_empty(self.capacity, self.width, dtype=self.dtype or aux.dtype)
        rows = self.buf[self.used: self.used + n]
        rows[:, : self.aux_width] = aux
        rows[:, self.aux_width:] = hidden
        self.spans[i] = (self.used, n)
        self.used += n

    def drop(self) -> int:
        """Let go of the buffer (the caller stops using this cache); the tokens it held."""
        kept, self.buf, self.spans, self.used = self.used, None, {}, 0
        return kept

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Conversation ``i``'s (aux [n, k*H], hidden [n, H]), views of the buffer."""
        at, n = self.spans[i]
        rows = self.buf[at: at + n]
        return rows[:, : self.aux_width], rows[:, self.aux_width:]


def free_bytes(device: torch.device) -> int:
    """Memory a cache may take on ``device``: on CUDA what is free (the allocator's unused blocks included)
    less the headroom training needs; on a CPU a share of the host's free memory."""
    if device.type != "cuda":
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * CPU_SHARE)
    free, total = torch.cuda.mem_get_info(device)
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return max(0, free + unused - max(HEADROOM_BYTES, int(total * HEADROOM_SHARE)))


def caches_for(token_counts: list[int], aux_width: int, hidden_width: int, dtype: torch.dtype,
               device: torch.device) -> list[FeatureCache]:
    """A cache for each set of ``token_counts[j]`` tokens, in that order of priority (validation first: it is
    small and read every few hundred steps), sharing the memory ``free_bytes`` allows."""
    left = free_bytes(device) // ((aux_width + hidden_width) * dtype.itemsize)
    caches = []
    for n in token_counts:
        caches.append(FeatureCache(aux_width, hidden_width, min(n, left), dtype))
        left -= caches[-1].capacity
    return caches
