"""KVCache: tree verification, commit/rollback, ragged batches, capacity errors.

The reference everywhere is a plain no-cache forward over the full token sequence.
"""

from __future__ import annotations

import pytest
import torch

from eaglet.errors import EagletError

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-4

# A 7-node tree (node: parent), depth up to 3, branching at nodes 0 and 1:
#
#   0 ─┬─ 1 ─┬─ 3 ── 6
#      │     └─ 4
#      └─ 2 ── 5
PARENT = [-1, 0, 0, 1, 1, 2, 3]


@pytest.fixture(scope="module")
def model(tiny_pair_module):
    _, ours, _ = tiny_pair_module("llama", seed=11)
    return ours


def _rand(n: int, seed: int, vocab: int = 384) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


@torch.no_grad()
def plain_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits [T, V] of a no-cache forward over one sequence."""
    h, _ = model(torch.tensor([ids]))
    return model.logits(h)[0]


def path_to(node: int, parent: list[int]) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parent[node]
    return path[::-1]


def tree_tensors(parent: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """depth [n], tree_mask [n, n] (node i sees j iff j is i or an ancestor of i)."""
    n = len(parent)
    mask = torch.zeros(n, n, dtype=torch.bool)
    depth = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        p = path_to(i, parent)
        mask[i, p] = True
        depth[i] = len(p) - 1
    return depth, mask


@torch.no_grad()
def prefill(model, prompts: list[list[int]], capacity: int):
    """Right-padded batched prefill; returns (cache, last-token logits [B, V])."""
    b, t = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros(b, t, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
    cache = model.new_cache(b, capacity)
    h, _ = model(ids, cache.append_meta(t), cache)
    lens = torch.tensor([len(p) for p in prompts])
    cache.lens.copy_(lens)
    last = model.logits(h[torch.arange(b), lens - 1])
    return cache, last


@torch.no_grad()
def tree_forward(model, cache, tokens: torch.Tensor, parents: list[list[int]]) -> torch.Tensor:
    """Forward a tree per row (tokens [B, n]); returns logits [B, n, V]."""
    depths, masks = zip(*(tree_tensors(p) for p in parents), strict=True)
    meta = cache.tree_meta(torch.stack(depths), torch.stack(masks))
    h, _ = model(tokens, meta, cache)
    return model.logits(h)


def test_tree_logits_equal_plain_forward_per_node(model):
    prompt = _rand(10, 1)
    tree = _rand(len(PARENT), 2)
    cache, _ = prefill(model, [prompt], 32)
    logits = tree_forward(model, cache, torch.tensor([tree]), [PARENT])
    worst = 0.0
    for i in range(len(PARENT)):
        ref = plain_logits(model, prompt + [tree[j] for j in path_to(i, PARENT)])[-1]
        worst = max(worst, (logits[0, i] - ref).abs().max().item())
    print(f"[tree] max |node logits - plain forward| = {worst:.3e}")
    assert worst < TOL
    assert int(cache.lens[0]) == 10  # a tree forward commits nothing by itself


def test_tree_batch_ragged_and_unordered_nodes(model):
    """Two rows with different prompt lengths; row 1 writes its nodes in a non-topological order."""
    prompts = [_rand(7, 3), _rand(13, 4)]
    order = [6, 2, 0, 5, 3, 1, 4]  # slot k holds original node order[k]
    pos = {node: k for k, node in enumerate(order)}
    parent1 = [pos[PARENT[node]] if PARENT[node] >= 0 else -1 for node in order]
    trees = [_rand(7, 5), _rand(7, 6)]
    cache, _ = prefill(model, prompts, 32)
    logits = tree_forward(model, cache, torch.tensor(trees), [PARENT, parent1])
    worst = 0.0
    for b, par in enumerate([PARENT, parent1]):
        for i in range(7):
            ref = plain_logits(model, prompts[b] + [trees[b][j] for j in path_to(i, par)])[-1]
            worst = max(worst, (logits[b, i] - ref).abs().max().item())
    print(f"[tree, batch 2 ragged] max |node logits - plain forward| = {worst:.3e}")
    assert worst < TOL

    # Commit the path to original node 6 in both rows; in row 1 its slots are out of order
    # (slot 2 before slot 0), so commit must gather before it writes.
    paths = [path_to(6, PARENT), path_to(pos[6], parent1)]
    assert paths[1] == [2, 5, 4, 0]
    cache.commit(torch.tensor(paths), torch.tensor([4, 4]))
    nxt = [_rand(1, 31), _rand(1, 32)]
    with torch.no_grad():
        h, _ = model(torch.tensor(nxt), cache.append_meta(1), cache)
        got = model.logits(h)[:, 0]
    for b in range(2):
        ref = plain_logits(model, prompts[b] + [trees[b][j] for j in paths[b]] + nxt[b])[-1]
        assert (got[b] - ref).abs().max().item() < TOL


@torch.no_grad()
def test_commit_then_decode_as_if_rejected_nodes_never_came(model):
    prompts = [_rand(9, 7), _rand(6, 8)]
    trees = [_rand(7, 9), _rand(7, 10)]
    cache, _ = prefill(model, prompts, 48)
    tree_forward(model, cache, torch.tensor(trees), [PARENT, PARENT])
    # Row 0 accepts 0 -> 1 -> 3 -> 6 (skipping slots 2, 4, 5); row 1 accepts 0 -> 2 (padded).
    accepted = torch.tensor([[0, 1, 3, 6], [0, 2, 0, 0]])
    n_acc = torch.tensor([4, 2])
    cache.commit(accepted, n_acc)
    assert cache.lens.tolist() == [13, 8]
    seqs = [prompts[b] + [trees[b][j] for j in accepted[b, : n_acc[b]].tolist()] for b in range(2)]

    # Decode three more tokens in one append, then one more step, then a second tree round.
    nxt = [_rand(3, 11), _rand(3, 12)]
    h, _ = model(torch.tensor(nxt), cache.append_meta(3), cache)
    cache.advance(3)
    got = model.logits(h)
    worst = 0.0
    for b in range(2):
        seqs[b] = seqs[b] + nxt[b]
        ref = plain_logits(model, seqs[b])[-3:]
        worst = max(worst, (got[b] - ref).abs().max().item())

    trees2 = [_rand(7, 13), _rand(7, 14)]
    logits = tree_forward(model, cache, torch.tensor(trees2), [PARENT, PARENT])
    for b in range(2):
        for i in range(7):
            ref = plain_logits(model, seqs[b] + [trees2[b][j] for j in path_to(i, PARENT)])[-1]
            worst = max(worst, (logits[b, i] - ref).abs().max().item())
    # Row 0 rejects the whole tree but its root (1 token); row 1 takes the deepest path.
    cache.commit(torch.tensor([[0, 0, 0, 0], [0, 1, 3, 6]]), torch.tensor([1, 4]))
    seqs[0] = seqs[0] + [trees2[0][0]]
    seqs[1] = seqs[1] + [trees2[1][j] for j in (0, 1, 3, 6)]
    assert cache.lens.tolist() == [len(s) for s in seqs]
    last = [_rand(1, 15), _rand(1, 16)]
    h, _ = model(torch.tensor(last), cache.append_meta(1), cache)
    got = model.logits(h)[:, 0]
    for b in range(2):
        ref = plain_logits(model, seqs[b] + last[b])[-1]
        worst = max(worst, (got[b] - ref).abs().max().item())
    print(f"[commit/rollback] max |logits - fresh run over accepted tokens| = {worst:.3e}")
    assert worst < TOL


@torch.no_grad()
def test_ragged_batch_matches_batch_1(model):
    prompts = [_rand(5, 21), _rand(12, 22), _rand(9, 23)]
    cache, last = prefill(model, prompts, 24)
    worst = 0.0
    seqs = [list(p) for p in prompts]
    for _ in range(5):
        for b in range(3):
            ref = plain_logits(model, seqs[b])[-1]
            worst = max(worst, (last[b] - ref).abs().max().item())
        nxt = last.argmax(-1)  # [B] greedy, each row its own continuation
        for b in range(3):
            seqs[b].append(int(nxt[b]))
        h, _ = model(nxt.view(3, 1), cache.append_meta(1), cache)
        cache.advance(1)
        last = model.logits(h[:, 0])
    print(f"[ragged batch] max |row logits - batch-1 logits| = {worst:.3e}")
    assert worst < TOL
    assert cache.lens.tolist() == [10, 17, 14]


def test_check_room(model):
    cache = model.new_cache(2, 16)
    cache.lens.copy_(torch.tensor([4, 10]))
    cache.check_room(6)  # 10 + 6 = 16 fits exactly
    with pytest.raises(EagletError) as e:
        cache.check_room(7)
    msg = str(e.value)
    assert "17" in msg and "16" in msg and "\n" not in msg


def test_reshaped_sees_the_same_memory_as_other_rows_and_slots():
    from eaglet.kv_cache import KVCache

    cache = KVCache(2, 1, 64, 3, 4, torch.float32, "cpu")
    four = cache.reshaped(4, 16)
    assert four.batch == 4 and four.capacity == 16 and four.k[1].shape == (4, 3, 16, 4)
    four.layer(1).write(torch.ones(4, 2, 3, 4), torch.ones(4, 2, 3, 4), torch.tensor([[0, 15]] * 4))
    assert cache.k[1].sum() == four.k[1].sum() == 4 * 2 * 3 * 4, "written through the view, held by the storage"
    assert cache.lens.tolist() == [0] and four.lens.tolist() == [0] * 4, "lens are the view's own"
    assert cache.reshaped(2, 32).k[0].data_ptr() == cache.k[0].data_ptr()
    with pytest.raises(ValueError, match="do not fit"):
        cache.reshaped(4, 17)


def test_every_layer_owns_its_storage_so_the_layers_region_compiles_once():
    """Each layer's K and V begin their own storage: torch 2.11 reuses the decoder layer's compiled region only for
    inputs of equal storage offsets, which views of one stacked buffer do not have (scripts/layer_compile.py)."""
    from eaglet.kv_cache import KVCache
    from eaglet.models.mla import LatentCache

    for cache in (KVCache(3, 2, 16, 2, 4, torch.float32, "cpu"), LatentCache(3, 2, 16, 4, 2, torch.float32, "cpu")):
        tensors = cache.k + cache.v
        assert len(tensors) == (6 if cache.v else 3)
        assert all(t.storage_offset() == 0 for t in tensors)
        assert len({t.untyped_storage().data_ptr() for t in tensors}) == len(tensors)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # CUDA: land_rows's one Triton launch


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [[1, 2], [3, 0]])
def test_copy_rows_from_lands_every_layer_in_neighbouring_or_scattered_rows(rows, device):
    """A prefill's rows (here from a reshaped scratch, as PrefillGraphs leaves them) land in the batch's ``rows``:
    every layer's K and V up to the longest row, and ``lens``; other rows untouched. Neighbouring rows go by a
    slice, scattered ones by an index tensor (``row_index``)."""
    from eaglet.kv_cache import KVCache, row_index

    cache = KVCache(3, 4, 16, 2, 4, torch.float32, device)
    storage = KVCache(3, 1, 64, 2, 4, torch.float32, device)
    src = storage.reshaped(2, 32)
    for i, t in enumerate(src.k + src.v):
        t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(i)))
    assert src.k[1].data_ptr() == storage.k[1].data_ptr()
    src.lens.copy_(torch.tensor([5, 3]))
    cache.copy_rows_from(src, rows)
    assert isinstance(row_index(rows, device), slice) == (rows == [1, 2])
    others = [r for r in range(4) if r not in rows]
    for layer in range(3):
        for mine, theirs in ((cache.k[layer], src.k[layer]), (cache.v[layer], src.v[layer])):
            for i, r in enumerate(rows):
                assert torch.equal(mine[r, :, :5], theirs[i, :, :5]) and not mine[r, :, 5:].any()
            assert not mine[others].any()
    assert cache.lens[rows].tolist() == [5, 3] and not cache.lens[others].any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory and non-blocking copies are CUDA's")
def test_to_device_does_not_wait_for_the_queue_and_arrives_whole():
    """Behind ~60 ms of queued device work, ``to_device`` returns at once (``torch.tensor(..., device=)`` would wait
    for the queue to drain), and the values arrive whole once the queue has run."""
    import time

    from eaglet.kv_cache import to_device

    rows = [list(range(i, i + 300)) for i in range(4)]
    to_device(rows, "cuda", torch.long)  # the pinned allocator's first block of this size, as in a steady state
    torch.cuda.synchronize()
    torch.cuda._sleep(100_000_000)  # ~60 ms of a ~1.7 GHz clock
    t0 = time.perf_counter()
    x = to_device(rows, "cuda", torch.long)
    waited = time.perf_counter() - t0
    assert waited < 0.02, f"to_device waited {waited * 1e3:.1f} ms for the device"
    assert x.tolist() == rows


@torch.no_grad()
def test_a_prefill_into_empty_rows_attends_without_a_mask(model, monkeypatch):
    """A causal append to empty rows (an eager prefill) takes SDPA's causal path, no dense mask: the same
    logits at every row's real tokens as the masked path, and a later append (rows not empty) or a static
    forward (``n_slots``) keeps the mask."""
    import eaglet.kv_cache as kv

    prompts = [_rand(37, 1), _rand(20, 2)]  # right-padded to 37
    ids = torch.zeros(2, 37, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)

    def forward(cache, n_slots=None):
        meta = cache.append_meta(ids.shape[1], n_slots)
        h, _ = model(ids, meta, cache)
        return model.logits(h), meta

    fast, meta = forward(model.new_cache(2, 64))
    assert meta.from_empty() and meta.mask is None  # no mask was built
    monkeypatch.setattr(kv.AttnMeta, "from_empty", lambda self: False)
    masked, meta = forward(model.new_cache(2, 64))
    assert meta.mask is not None
    monkeypatch.undo()
    for i, p in enumerate(prompts):
        torch.testing.assert_close(fast[i, : len(p)], masked[i, : len(p)], atol=TOL, rtol=TOL)
        torch.testing.assert_close(fast[i, : len(p)], plain_logits(model, p), atol=TOL, rtol=TOL)
    cache = model.new_cache(2, 64)
    cache.lens.fill_(3)
    assert not cache.append_meta(4).from_empty()  # rows with committed slots
    assert not model.new_cache(2, 64).append_meta(4, 64).from_empty()  # static shapes
