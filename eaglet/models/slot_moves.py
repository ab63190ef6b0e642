"""Moving slots in every layer's cache at once: the accepted path's commit after a verify, and a prefill's rows
landing in a batch (``land_rows``).

``KVCache.commit`` moves each row's accepted tree nodes to contiguous slots in each of the
target's caches (2 x 30 for SmolLM2). Done cache by cache that is one gather-and-scatter kernel
per cache: on the H200 60 launches of ~1 us each inside every speculative iteration (session 25: with
this operator the 4,1,5 iteration went from 1.217 to 1.140 ms, 478 to 417 kernels). The caches cannot be one tensor with
per-layer views instead: inductor then copies the whole cache at every per-layer write (it does
not write aliased inputs in place). So the caches stay separate and one Triton program per
(cache, row, KV head) moves the slots, reading each cache's address from a table of pointers.

The operator is opaque to torch.compile and declares that it mutates the caches, which inductor
then hands to it in place (checked: no copy of a cache in the generated code). Off CUDA, or
without Triton, it moves cache by cache.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None  # for every kernel of eaglet


@functools.cache
def sm_count(device: int) -> int:
    """The multiprocessors of CUDA device ``device``, for kernels that size their grids to fill them."""
    return torch.cuda.get_device_properties(device).multi_processor_count

# Each cache list's address table, by the caches' addresses: built on the first move (warm-up, before a graph's
# capture, where no host-to-device copy may run). Never dropped: a captured graph keeps reading its table's memory.
_TABLES: dict[tuple[int, ...], torch.Tensor] = {}

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _move_slots(Table, Src, Dst, sb, sh, ss, sa, A, D: tl.constexpr, BLOCK_A: tl.constexpr,
                    BLOCK_D: tl.constexpr, WORD: tl.constexpr):
        c, b, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        base = tl.load(Table + c).to(tl.pointer_type(WORD)) + b * sb + h * sh
        a = tl.arange(0, BLOCK_A)
        d = tl.arange(0, BLOCK_D)
        ok = (a < A)[:, None] & (d < D)[None, :]
        src = tl.load(Src + b * sa + a, mask=a < A, other=0)
        dst = tl.load(Dst + b * sa + a, mask=a < A, other=0)
        # Every source slot is loaded before any is written: a path's sources lie at or after its targets.
        moved = tl.load(base + src[:, None] * ss + d[None, :], mask=ok)  # [BLOCK_A, BLOCK_D]
        tl.store(base + dst[:, None] * ss + d[None, :], moved, mask=ok)


    @triton.jit
    def _land_rows(DstTable, SrcTable, Rows, row0, db, dh, ds, sb, sh, ss, S, D: tl.constexpr, BLOCK_S: tl.constexpr,
                   BLOCK_D: tl.constexpr, WORD: tl.constexpr, HAS_ROWS: tl.constexpr):
        c, i, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        if HAS_ROWS:
            r = tl.load(Rows + i)
        else:
            r = (row0 + i).to(tl.int64)
        dst = tl.load(DstTable + c).to(tl.pointer_type(WORD)) + r * db + h * dh
        src = tl.load(SrcTable + c).to(tl.pointer_type(WORD)) + i * sb + h * sh
        d = tl.arange(0, BLOCK_D)
        for s0 in tl.range(0, S, BLOCK_S):
            s = s0 + tl.arange(0, BLOCK_S)
            ok = (s < S)[:, None] & (d < D)[None, :]
            tl.store(dst + s[:, None] * ds + d[None, :], tl.load(src + s[:, None] * ss + d[None, :], mask=ok), mask=ok)


def _table(caches: list[torch.Tensor]) -> torch.Tensor:
    key = tuple(t.data_ptr() for t in caches)
    table = _TABLES.get(key)
    if table is None:
        first = caches[0]
        if any(t.shape != first.shape or t.stride() != first.stride() or t.dtype != first.dtype for t in caches):
            raise ValueError("slot moves need caches of one shape, layout and dtype")
        table = _TABLES[key] = torch.tensor(key, dtype=torch.int64, device=first.device)
    return table


def _kernel_takes(t: torch.Tensor) -> bool:
    """Whether the kernels here can move ``t``'s slots: CUDA with Triton, rows of contiguous words."""
    return t.is_cuda and HAS_TRITON and t.stride(-1) == 1 and t.element_size() in (1, 2, 4)


def _word(t: torch.Tensor):
    return {1: tl.int8, 2: tl.int16, 4: tl.int32}[t.element_size()]  # the bits move unchanged


def _launch(caches: list[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    first = caches[0]  # [B, h, S, D], the last dimension contiguous
    b, h, _, d = first.shape
    a = src.shape[1]
    src, dst = src.contiguous(), dst.contiguous()
    _move_slots[(len(caches), b, h)](
        _table(caches), src, dst, first.stride(0), first.stride(1), first.stride(2), src.stride(0), a,
        D=d, BLOCK_A=triton.next_power_of_2(a), BLOCK_D=triton.next_power_of_2(d), WORD=_word(first))


@torch.library.custom_op("eaglet::move_slots", mutates_args=("caches",))
def move_slots(caches: list[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """In each cache [B, h, S, D] of one shape: slots ``src[b]`` of row ``b`` into its slots ``dst[b]``
    (src, dst [B, A], each row's sources read before any target is written)."""
    if not caches:
        return
    if _kernel_takes(caches[0]):
        _launch(caches, src, dst)
        return
    rows = torch.arange(src.shape[0], device=src.device).unsqueeze(1)  # [B, 1]
    for cache in caches:
        cache[rows, :, dst] = cache[rows, :, src]  # [B, A, h, D], gathered before writing


@move_slots.register_fake
def _(caches: list[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    return None


def _land(dst: list[torch.Tensor], src: list[torch.Tensor], rows: slice | torch.Tensor, slots: int) -> None:
    first = src[0]  # [n, h, S', D], the last dimension contiguous
    n, h, _, d = first.shape
    has_rows = isinstance(rows, torch.Tensor)
    table = _table(dst)
    _land_rows[(len(dst), n, h)](
        table, _table(src), rows if has_rows else table, 0 if has_rows else rows.start,  # Rows unread for a slice
        dst[0].stride(0), dst[0].stride(1), dst[0].stride(2), first.stride(0), first.stride(1), first.stride(2),
        slots, D=d, BLOCK_S=max(1, 4096 // triton.next_power_of_2(d)), BLOCK_D=triton.next_power_of_2(d),
        WORD=_word(first), HAS_ROWS=has_rows)


def land_rows(dst: list[torch.Tensor], src: list[torch.Tensor], rows: slice | torch.Tensor, slots: int) -> None:
    """Slots ``0..slots-1`` of rows ``0..n-1`` of each ``src[c]`` [n, h, S', D] into rows ``rows`` (a slice of
    neighbouring rows or an index tensor [n]) of ``dst[c]`` [B, h, S, D]: a prefill made elsewhere landing in a
    batch. On CUDA one launch for every layer's K and V (a copy a cache was 60 launches and ~0.9 ms of host time for
    SmolLM2, session 38), though each cache is an allocation of its own (``KVCache``: why)."""
    if slots > 0 and _kernel_takes(src[0]) and _kernel_takes(dst[0]) and src[0].dtype == dst[0].dtype:
        _land(dst, src, rows, slots)
        return
    for mine, theirs in zip(dst, src):
        mine[rows, :, :slots] = theirs[:, :, :slots]
