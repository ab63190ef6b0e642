"""``eaglet::move_slots``: the commit's slot moves in every cache at once, in place, under torch.compile too; and
``land_rows``: a prefill's rows landing in a batch's caches in one launch."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from eaglet.models import slot_moves
from eaglet.models.slot_moves import move_slots
from tests.conftest import TRITON_DEVICE

KERNEL = TRITON_DEVICE  # where the kernel itself runs
DEVICES = ["cpu"] + (["cuda"] if KERNEL == "cuda" else [])  # where the operator runs: its loop, or the kernel


def moved(caches: list[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> list[torch.Tensor]:
    """What each cache holds after the moves, one cache at a time from a copy."""
    out = [c.clone() for c in caches]
    rows = torch.arange(src.shape[0], device=src.device).unsqueeze(1)
    for c in out:
        c[rows, :, dst] = c[rows, :, src].clone()
    return out


def paths(b: int, width: int, nodes: int, lens: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted paths as commit makes them: increasing node indices after each row's ``lens`` -> src, dst [B, A]."""
    g = torch.Generator().manual_seed(b * 31 + width)
    nodes = torch.stack([torch.sort(torch.randperm(nodes, generator=g)[:width]).values for _ in range(b)])
    base = torch.tensor(lens).unsqueeze(1)
    return (base + nodes).to(device), (base + torch.arange(width)).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, shape, width, lens", [
    (torch.float32, (2, 3, 64, 16), 5, [0, 20]),  # sources overlap targets: read before written
    (torch.bfloat16, (1, 3, 128, 64), 7, [90]),  # SmolLM2's heads
    (torch.bfloat16, (3, 1, 40, 72), 3, [1, 2, 30]),  # a latent cache: one head, a width not a power of two
])
def test_moves_equal_moving_cache_by_cache(device, dtype, shape, width, lens):
    g = torch.Generator().manual_seed(0)
    caches = [torch.randn(shape, generator=g).to(dtype).to(device) for _ in range(6)]
    src, dst = paths(shape[0], width, 9, lens, device)
    want = moved(caches, src, dst)
    move_slots(caches, src, dst)
    assert all(torch.equal(c, w) for c, w in zip(caches, want))


@pytest.mark.skipif(KERNEL is None, reason="needs CUDA and Triton, or Triton's interpreter")
@pytest.mark.parametrize("dtype, shape, width, lens", [
    (torch.float32, (2, 3, 64, 16), 5, [0, 20]),
    (torch.float16, (1, 3, 128, 64), 7, [90]),
    (torch.float32, (3, 1, 40, 72), 3, [1, 2, 30]),
])
def test_the_kernel_moves_what_the_loop_moves(dtype, shape, width, lens):
    """The Triton kernel itself (the operator's CUDA branch), on whatever device Triton runs here."""
    g = torch.Generator().manual_seed(2)
    caches = [torch.randn(shape, generator=g).to(dtype).to(KERNEL) for _ in range(5)]
    src, dst = paths(shape[0], width, 9, lens, KERNEL)
    want = moved(caches, src, dst)
    slot_moves._launch(caches, src, dst)
    assert all(torch.equal(c, w) for c, w in zip(caches, want))


@pytest.mark.skipif(KERNEL is None, reason="needs CUDA and Triton, or Triton's interpreter")
@pytest.mark.parametrize("dtype, dst_shape, src_rows, src_slots, rows, slots", [
    (torch.float32, (4, 2, 16, 4), 2, 32, slice(1, 3), 5),  # neighbouring rows, from a reshaped scratch's longer rows
    (torch.bfloat16, (5, 3, 160, 64), 3, 128, [4, 0, 2], 100),  # SmolLM2's heads; the slots span two blocks
    (torch.float16, (3, 1, 40, 72), 2, 40, [2, 0], 37),  # a latent cache: one head, a width not a power of two
])
def test_the_landing_kernel_lands_what_the_loop_lands(dtype, dst_shape, src_rows, src_slots, rows, slots):
    """``land_rows``'s Triton kernel against its loop (the CPU branch): slots past ``slots``, other rows untouched."""
    g = torch.Generator().manual_seed(3)
    b, h, _, d = dst_shape
    dst = [torch.randn(dst_shape, generator=g).to(dtype).to(KERNEL) for _ in range(6)]
    src = [torch.randn(src_rows, h, src_slots, d, generator=g).to(dtype).to(KERNEL) for _ in range(6)]
    index = rows if isinstance(rows, slice) else torch.tensor(rows, device=KERNEL)
    want = [t.cpu().clone() for t in dst]
    slot_moves.land_rows(want, [t.cpu() for t in src], index if isinstance(rows, slice) else index.cpu(), slots)
    slot_moves._land(dst, src, index, slots)
    assert all(torch.equal(t.cpu(), w) for t, w in zip(dst, want))


def test_compiled_moves_write_the_caches_in_place():
    """Inductor hands the operator the caches themselves: no buffer of a cache's size is allocated (a copy of
    every cache a step is what one tensor with per-layer views cost), and the result is eager's."""
    shape = (2, 3, 64, 8)
    g = torch.Generator().manual_seed(1)
    caches = [torch.randn(shape, generator=g) for _ in range(4)]
    expected = [c.clone() for c in caches]
    rows = torch.arange(2).unsqueeze(1)
    src, dst = paths(2, 3, 6, [4, 9], "cpu")

    def step(x, slots, src, dst, caches):
        for i, cache in enumerate(caches):  # the forward's per-layer writes, then the commit
            cache[rows, :, slots] = x * i
        move_slots(caches, src, dst)
        return x.sum()

    x, slots = torch.randn(2, 2, 3, 8, generator=g), torch.tensor([[10, 11], [15, 16]])
    _, code = run_and_get_code(torch.compile(step, fullgraph=True), x, slots, src, dst, caches)
    step(x, slots, src, dst, expected)
    assert "eaglet.move_slots" in code[0]
    assert "empty_strided_cpu((2, 3, 64, 8)" not in code[0], "a cache was copied"
    assert all(torch.equal(c, e) for c, e in zip(caches, expected))


def test_caches_of_different_layouts_are_refused():
    if "cuda" not in DEVICES:
        pytest.skip("the kernel's table needs CUDA and Triton")
    caches = [torch.zeros(1, 1, 8, 4, device="cuda"), torch.zeros(1, 1, 16, 4, device="cuda")]
    with pytest.raises(ValueError, match="one shape"):
        move_slots(caches, torch.zeros(1, 2, dtype=torch.long, device="cuda"),
                   torch.zeros(1, 2, dtype=torch.long, device="cuda"))
