"""The target's side of speculative decoding: prefill with capture, and tree verification.

Both forwards capture the draft's residual-stream points (``draft.config.capture``),
so the features the draft reads in serving are exactly the ones it was trained on.
Verification is one forward over every tree node: the tree mask lets each node see
the committed cache and its own ancestors, each node sits at position ``lens + depth``,
and the K/V it writes stays above ``lens`` until ``KVCache.commit`` keeps the
accepted path.
"""

from __future__ import annotations

import torch

from eaglet.generate import pad_batch, prefill_forward
from eaglet.kv_cache import KVCache
from eaglet.models.llama import Transformer
from eaglet.speculative.tree import Tree


def prefill(model: Transformer, cache: KVCache, prompts: list[list[int]],
            capture: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded prefill -> (last-position logits [B, V], captured points [B, T, k*H])."""
    ids, lengths = pad_batch(prompts, cache.lens.device)
    logits, aux = prefill_forward(model, cache, ids, lengths - 1, capture)
    cache.advance(lengths)
    return logits, aux


def verify(model: Transformer, cache: KVCache, tree: Tree, capture: tuple[int, ...],
           n_slots: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One target forward over all tree nodes -> (logits [B, N, V], captured points [B, N, k*H])."""
    meta = cache.tree_meta(tree.depth, tree.mask, n_slots)
    # Nodes past the model's window can only matter for tokens the context cannot hold
    # anyway (those are never emitted); clamping keeps the rotary lookup in range.
    meta.positions.clamp_(max=model.rotary.cos.shape[0] - 1)
    h, aux = model(tree.tokens, meta, cache, capture=capture)
    return model.logits(h), aux
