"""The draft's committed cache: anchors fed with real target features, as in training.

Anchor ``t`` is a committed target position. Its draft entry is computed from
``fuse(target points at t)`` and the embedding of the token at ``t + 1``, at rotary
position ``t``, in draft slot ``t`` (so the draft cache's ``lens`` always equals the
target cache's). After prefill of ``x_0..x_{P-1}`` and sampling the root ``x_P``, the
anchors are ``0..P-1``. After a verify accepts root + ``m`` draft tokens and picks the
next token ``y``, the new anchors are those ``1 + m`` positions, fed with the following
accepted token and finally ``y``; they overwrite the tree's scratch slots, since the
tree's own draft entries came from draft features, not target ones. The output at the
last anchor seeds the next tree.
"""

from __future__ import annotations

import torch

from eaglet.generate import pad_batch
from eaglet.kv_cache import KVCache
from eaglet.prefill import PrefillGraphs


def _clamped(meta, max_pos: int):
    meta.positions = meta.positions.clamp(max=max_pos)  # a new tensor: append_meta shares it with slots
    return meta


def draft_prefill(draft, embed, cache: KVCache, prompts: list[list[int]], aux: torch.Tensor,
                  roots: torch.Tensor) -> torch.Tensor:
    """Anchors 0..P-1 of each prompt; aux [B, T, k*H] from the target's prefill -> seed [B, H]."""
    ids, lengths = pad_batch(anchor_tokens(prompts, roots.tolist()), cache.lens.device)  # ids [B, T]
    seed = draft_anchors(draft, embed, cache, ids, lengths - 1, aux)
    cache.advance(lengths)
    return seed


def anchor_tokens(prompts: list[list[int]], roots: list[int]) -> list[list[int]]:
    """The token after each prompt position: the prompt shifted by one, then its sampled root."""
    return [p[1:] + [r] for p, r in zip(prompts, roots)]


def draft_anchors(draft, embed, cache: KVCache, ids: torch.Tensor, last: torch.Tensor, aux: torch.Tensor,
                  n_slots: int | None = None, empty: bool = False) -> torch.Tensor:
    """Anchors after each row's committed slots (not advanced): ids [B, T] the next tokens, aux [B, T, k*H]
    -> the draft output at each row's position ``last`` [B, H]. ``n_slots``: static shapes; ``empty``: the rows
    hold nothing (both: the graphed prefills)."""
    meta = _clamped(cache.append_meta(ids.shape[1], n_slots, empty), draft.rotary.cos.shape[0] - 1)
    out = draft(draft.fuse(aux), embed(ids), meta, cache)  # [B, T, H]
    return out[torch.arange(ids.shape[0], device=ids.device), last]


def commit_and_extend(draft, embed, target_cache: KVCache, draft_cache: KVCache, aux: torch.Tensor,
                      path: torch.Tensor, n_commit: torch.Tensor, anchor_tokens: torch.Tensor,
                      n_slots: int | None = None) -> torch.Tensor:
    """Keep the accepted path in the target cache and add its anchors to the draft cache.

    aux [B, N, k*H]: the verify's captured points; path [B, W]: accepted nodes, root first;
    n_commit [B]: how many to keep (0 for finished rows); anchor_tokens [B, W]: the token
    after each path node. Returns the draft output at each row's last new anchor [B, H].
    """
    target_cache.commit(path, n_commit)
    w = path.shape[1]
    feats = aux.gather(1, path.unsqueeze(-1).expand(-1, -1, aux.shape[-1]))  # [B, W, k*H]
    meta = _clamped(draft_cache.append_meta(w, n_slots), draft.rotary.cos.shape[0] - 1)
    out = draft(draft.fuse(feats), embed(anchor_tokens), meta, draft_cache)  # [B, W, H]
    draft_cache.advance(n_commit)
    return out[torch.arange(path.shape[0], device=path.device), (n_commit - 1).clamp(min=0)]


def draft_prefills(draft, embed, target: PrefillGraphs, aux_width: int) -> PrefillGraphs:
    """``draft_anchors`` per bucket (``prefill.PrefillGraphs``) with the ``target``'s buckets, reading its
    captured points of the same bucket (``aux_width`` = k*H) -> (seed,)."""
    p = embed.weight

    def forward(ids: torch.Tensor, last: torch.Tensor, cache: KVCache, aux: torch.Tensor) -> tuple[torch.Tensor]:
        return (draft_anchors(draft, embed, cache, ids, last, aux, ids.shape[1], empty=True),)

    return PrefillGraphs(draft.new_cache, forward, p.device, target.max_length, target.max_tokens,
                         lambda rows, length: (torch.zeros(rows, length, aux_width, dtype=p.dtype, device=p.device),),
                         target.graphs, target.compiled)
