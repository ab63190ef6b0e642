"""Preallocated KV cache addressed by slot, and the attention metadata that drives it.

Each sequence ``b`` owns slots ``0..capacity-1`` of its row. ``lens[b]`` slots are
committed. A forward writes its ``T`` new tokens' K/V at explicit ``slots`` (some of
``lens..lens+E-1``) and each new token sees every committed slot plus those of the ``E``
new slots its row of ``extra`` marks, so the same forward serves prefill and decode
(causal ``extra``), a tree of draft tokens (the tree mask, per-node positions) and the
draft's frontier steps. After verification ``commit`` moves the accepted path to
contiguous slots; the rest is rolled back simply by not counting it (nothing ever sees
slots at or beyond ``lens`` except the new tokens).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.utils._pytree as pytree

from eaglet.errors import EagletError
from eaglet.models.slot_moves import land_rows, move_slots


@dataclass
class AttnMeta:
    """Where new tokens go and what they see.

    Over a cache: ``lens`` and ``extra`` (the compact form the CUDA kernel reads; ``mask``
    is built from them only for SDPA, over ``n_slots`` slots, or just those in use).
    Without a cache (training, capture): ``mask`` over the tokens themselves.
    """

    positions: torch.Tensor  # [B, T] rotary positions
    slots: torch.Tensor  # [B, T] cache slots written
    mask: torch.Tensor | None = None  # [B, 1, T, S] True = attend
    lens: torch.Tensor | None = None  # [B] committed slots, seen by every new token
    extra: torch.Tensor | None = None  # [B, T, E] new token t sees slot lens + e
    n_slots: int | None = None  # S of the dense mask (static shapes); None: the slots in use
    causal: bool = False  # ``extra`` is the causal mask of tokens appended after ``lens`` (``append_meta``)
    # The rows hold nothing committed, known when the forward is built (a graphed prefill resets its scratch rows
    # first): attention is then SDPA's causal path at every length (``attention.kernel_applies``).
    empty: bool = False
    _longest: int | None = None  # the most slots a row has committed, read from ``lens`` once (eager forwards)

    def longest(self) -> int:
        if self._longest is None:
            self._longest = int(self.lens.max())
        return self._longest

    def from_empty(self) -> bool:
        """Whether this is a causal append to rows with nothing committed (a prefill), so that each new token sees
        exactly the new tokens before it and attention needs no mask: ``empty``, or an eager forward that reads
        ``lens`` once for this and its dense mask (a forward of static shapes, ``n_slots``, never reads it)."""
        return self.causal and (self.empty or (self.n_slots is None and self.longest() == 0))

    def dense_mask(self) -> torch.Tensor:
        """[B, 1, T, S] True = attend; built once per forward (every layer reads the same one)."""
        if self.mask is None:
            self.mask = self._build_mask()
        return self.mask

    def _build_mask(self) -> torch.Tensor:
        b, t, e = self.extra.shape
        s = self.n_slots if self.n_slots is not None else self.longest() + e
        slot = torch.arange(s, device=self.lens.device).view(1, 1, s)
        lens = self.lens.view(-1, 1, 1)
        rel = (slot - lens).clamp(0, e - 1).expand(b, t, s)  # [B, T, S]
        new = (slot >= lens) & (slot < lens + e)
        return ((slot < lens) | (self.extra.gather(2, rel) & new)).unsqueeze(1)


# A pytree (the tensors and sizes as leaves, the flags as constants), so that torch.compile can trace the decoder
# layer once and reuse it for every layer (``nested_compile_region`` reuses a region whose inputs are tensors,
# constants, modules or pytrees of them; an unregistered object made it trace and compile each layer:
# scripts/layer_compile.py). ``n_slots`` is a leaf: a compiled prefill's is its symbolic length, which a pytree's
# constants cannot hold.
pytree.register_pytree_node(
    AttnMeta,
    lambda m: ((m.positions, m.slots, m.mask, m.lens, m.extra, m.n_slots, m._longest), (m.causal, m.empty)),
    lambda leaves, consts: AttnMeta(*leaves[:6], *consts, _longest=leaves[6]),
)


class LayerKV(NamedTuple):
    """One layer of a KVCache: keys and values [B, nkv, capacity, D] and the rows' index [B, 1]. What the layers'
    compiled region reads instead of the cache and its layer number, which differs between layers (a tuple of
    tensors: the region is traced once and reused, as ``AttnMeta``'s registration above)."""

    k: torch.Tensor
    v: torch.Tensor
    rows: torch.Tensor

    def write(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        # k, v [B, T, n_kv, D]; slots [B, T]. Advanced indexing puts [B, T] first.
        self.k[self.rows, :, slots] = k
        self.v[self.rows, :, slots] = v

    def view(self, n_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[:, :, :n_slots], self.v[:, :, :n_slots]  # [B, n_kv, S, D]


def to_device(data, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.tensor(data, dtype=dtype, device=device)`` without waiting for the device. On CUDA a tensor made
    there from a list is a copy from pageable memory, which waits for everything queued before it; this goes up
    from pinned memory without blocking (torch keeps the pinned block until the copy has run), so the host's
    work goes on while the device runs what it was given (docs/performance.md, session 38)."""
    if torch.device(device).type != "cuda":
        return torch.tensor(data, dtype=dtype, device=device)
    return torch.tensor(data, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def row_index(rows: Sequence[int], device: torch.device) -> slice | torch.Tensor:
    """Rows of a batch to index its tensors with: neighbouring rows as a slice (nothing to copy to the device),
    others as an index tensor (``to_device``: without waiting for the device)."""
    rows = list(rows)
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return to_device(rows, device, torch.long)


class KVCache:
    def __init__(self, num_layers: int, batch: int, capacity: int, n_kv: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        self.capacity = capacity
        shape = (batch, n_kv, capacity, head_dim)
        # Every layer's K and V an allocation of its own, not views of one stacked buffer: torch 2.11's dynamo
        # reuses the layers' compiled region only where their inputs agree in every property, the storage offset
        # included, so views of one buffer made it compile each of the 30 layers (twice the compile time of a
        # prefill or decode step on the CPU, scripts/layer_compile.py, session 46; torch 2.13 reused either).
        # A landing is still one launch on CUDA (``land_rows``).
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]  # each [B, n_kv, S, D]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lens = torch.zeros(batch, dtype=torch.long, device=device)  # [B] committed slots
        self._rows = torch.arange(batch, device=device).unsqueeze(1)  # [B, 1]

    @property
    def batch(self) -> int:
        return self.lens.shape[0]

    def layer(self, layer: int) -> LayerKV:
        """One layer's keys and values, written and read through ``LayerKV.write`` / ``view``."""
        return LayerKV(self.k[layer], self.v[layer], self._rows)

    def reset(self) -> None:
        self.lens.zero_()

    def nbytes(self) -> int:
        """Bytes of the slots' storage (keys and values, or a latent cache's one buffer)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def rows(self, start: int, stop: int) -> KVCache:
        """Rows ``start..stop-1`` as a cache sharing this one's storage (and ``lens``).

        A request joining a running batch is prefilled through such a view into its own
        row, so the buffers a captured graph reads stay the same tensors.
        """
        view = copy.copy(self)
        view.k = [t[start:stop] for t in self.k]  # [stop-start, n_kv, capacity, D] views
        view.v = [t[start:stop] for t in self.v]
        view.lens = self.lens[start:stop]  # in-place updates reach the whole batch's lens
        view._rows = self._rows[: stop - start]
        return view

    def reshaped(self, rows: int, capacity: int) -> KVCache:
        """This cache's storage seen as ``rows`` rows of ``capacity`` slots, with ``lens`` of its own: one
        allocation serving as scratch for prefills of many shapes (``prefill.PrefillGraphs``), one at a time.
        Its rows are not this cache's rows: writing through either changes what the other holds."""
        if rows * capacity > self.batch * self.capacity:
            raise ValueError(f"{rows} x {capacity} slots do not fit in {self.batch} x {self.capacity}")

        def seen(t: torch.Tensor) -> torch.Tensor:  # [B, h, S, D] -> [rows, h, capacity, D], the same memory
            return t.flatten()[: rows * t.shape[1] * capacity * t.shape[3]].view(rows, t.shape[1], capacity, t.shape[3])

        view = copy.copy(self)
        view.k, view.v = [seen(t) for t in self.k], [seen(t) for t in self.v]
        view.capacity = capacity
        view.lens = torch.zeros(rows, dtype=torch.long, device=self.lens.device)
        view._rows = torch.arange(rows, device=self.lens.device).unsqueeze(1)
        return view

    def copy_rows_from(self, src: KVCache, rows: Sequence[int], slots: int | None = None) -> None:
        """Rows ``0..n-1`` of ``src`` (their committed slots and ``lens``) into this cache's ``rows``.

        In place, so the tensors a captured graph reads stay the same. The slots copied run to the
        longest row's ``lens`` (``slots`` when the caller knows it: no read of ``lens`` from the device); a
        shorter row's extra slots lie past its ``lens``, where nothing reads. Whole slots move, whatever a
        slot holds (a subclass without V has K only).
        """
        s = int(src.lens.max()) if slots is None else slots
        dst = row_index(rows, self.lens.device)
        land_rows(self.k + self.v, src.k + src.v, dst, s)
        self.lens[dst] = src.lens

    def check_room(self, extra: int) -> None:
        need = int(self.lens.max()) + extra
        if need > self.capacity:
            raise EagletError(
                f"the sequence needs {need} cache slots but the KV cache holds {self.capacity}; "
                "raise --max-context or shorten the prompt"
            )

    def append_meta(self, n_new: int, n_slots: int | None = None, empty: bool = False) -> AttnMeta:
        """Causal metadata for ``n_new`` tokens appended after each row's committed slots (``empty``: there are
        none, as in a graphed prefill's scratch rows)."""
        offs = torch.arange(n_new, device=self.lens.device)
        positions = self.lens.unsqueeze(1) + offs  # [B, T]
        causal = (offs.view(1, -1) <= offs.view(-1, 1)).expand(self.batch, n_new, n_new)  # [B, T, T]
        return AttnMeta(positions, positions, lens=self.lens, extra=causal, n_slots=n_slots, causal=True, empty=empty)

    def tree_meta(self, depth: torch.Tensor, tree_mask: torch.Tensor, n_slots: int | None = None) -> AttnMeta:
        """Metadata for a tree of ``n`` nodes written after the committed slots.

        depth [B, n]: depth of each node (root = 0); tree_mask [B, n, n]: node i sees node j
        iff j is i or an ancestor of i.
        """
        n = depth.shape[1]
        lens = self.lens.view(-1, 1)
        slots = lens + torch.arange(n, device=lens.device)  # [B, n]
        return AttnMeta(lens + depth, slots, lens=self.lens, extra=tree_mask, n_slots=n_slots)

    def commit(self, accepted: torch.Tensor, n_accepted: torch.Tensor) -> None:
        """Keep the accepted nodes of the last tree write, in order, and drop the rest.

        accepted [B, A]: node indices (into the tokens written after ``lens``) of each
        row's accepted path, padded arbitrarily past ``n_accepted[b]``; n_accepted [B].
        """
        a = accepted.shape[1]
        base = self.lens.unsqueeze(1)
        src = (base + accepted).clamp(max=self.capacity - 1)  # [B, A]
        dst = (base + torch.arange(a, device=base.device)).clamp(max=self.capacity - 1)
        move_slots([*self.k, *self.v], src, dst)  # one launch for every layer's K and V on CUDA
        self.lens += n_accepted

    def advance(self, n: torch.Tensor | int) -> None:
        self.lens += n


class Landing:
    """Where prompts joining rows of a running batch are prefilled, in one forward whatever the rows.

    Neighbouring rows are prefilled in place through their row view. Scattered rows are
    prefilled into a scratch cache of the prompts' size, then copied into their rows
    (``copy_rows_from``): one forward plus one copy a layer, against one forward a row. The
    scratch caches are kept, one per power-of-two count of rows, each grown to the longest
    prompt it has held (a power of two too), so a steady stream of admissions allocates nothing.
    """

    def __init__(self, cache: KVCache, new_cache: Callable[[int, int], KVCache]):
        self.cache, self.new_cache = cache, new_cache
        self.scratch: dict[int, KVCache] = {}

    @contextmanager
    def into(self, rows: Sequence[int], longest: int) -> Iterator[KVCache]:
        """A cache of ``len(rows)`` empty rows to prefill prompts of up to ``longest`` tokens into; on a clean
        exit its rows are the cache's ``rows``."""
        n, first = len(rows), rows[0]
        if list(rows) == list(range(first, first + n)):
            view = self.cache.rows(first, first + n)
            view.reset()
            yield view
            return
        size = 1 << (n - 1).bit_length()
        scratch = self.scratch.get(size)
        if scratch is None or scratch.capacity < longest:
            scratch = self.scratch[size] = self.new_cache(size, 1 << max(longest - 1, 1).bit_length())
        view = scratch.rows(0, n)
        view.reset()
        yield view
        self.land(view, rows)

    def land(self, view: KVCache, rows: Sequence[int], slots: int | None = None) -> None:
        """Copy ``view``'s rows, prefilled elsewhere (``prefill.PrefillGraphs``), into the cache's ``rows``."""
        self.cache.copy_rows_from(view, rows, slots)
