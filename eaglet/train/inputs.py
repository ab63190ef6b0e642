"""What one training step needs from the target, computed online or read from offline shards.

Online (the default: no ``--features``): the frozen target runs on the batch and
returns its captured points and final hidden state; with a ``FeatureCache``, each
conversation's are kept after their first forward and read back in later epochs. Offline:
both come from feature shards (``eaglet data capture``). Either way the target's own LM
head turns the final hidden state into the label distribution, and its embedding gives the
draft's token inputs, so the modes feed the draft identical tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from eaglet.capture import CaptureSpec
from eaglet.data.dataset import TokenData, pad_right
from eaglet.data.features import FeatureSet
from eaglet.loading.target import Target
from eaglet.train.feature_cache import FeatureCache


@dataclass
class StepInputs:
    ids: torch.Tensor  # [B, T] long
    mask: torch.Tensor  # [B, T] bool: assistant tokens
    aux: torch.Tensor  # [B, T, k*H] captured points
    emb: torch.Tensor  # [B, T, H] target embeddings of ids
    target_logp: torch.Tensor  # [B, T, Vd] float32 target log-probs over the draft vocabulary
    target_top: torch.Tensor  # [B, T] target argmax over its full vocabulary

    @property
    def num_tokens(self) -> int:
        return int(self.mask.numel())


class Featurizer:
    def __init__(self, target: Target, capture: CaptureSpec, draft_ids: torch.Tensor,
                 source: TokenData | FeatureSet, device: torch.device, max_len: int | None = None,
                 cache: FeatureCache | None = None):
        self.target, self.capture, self.source, self.device = target, capture, source, device
        self.cache = cache  # online only: each conversation's features after their first forward
        self.draft_ids = draft_ids.to(device)  # [Vd] target ids of the draft vocabulary, in its order
        self.offline = isinstance(source, FeatureSet)
        # On CUDA, padding T to a multiple of 64 keeps the set of kernel shapes small.
        self.multiple = 64 if device.type == "cuda" else 1
        self.max_len = max_len

    def _length(self, lengths: list[int]) -> int:
        t = -(-max(lengths) // self.multiple) * self.multiple
        return min(t, self.max_len) if self.max_len else t

    @torch.no_grad()
    def __call__(self, rows: Sequence[int]) -> StepInputs:
        model, dev = self.target.model, self.device
        if self.offline:
            items = [self.source.get(i) for i in rows]
            t = self._length([x["ids"].numel() for x in items])
            ids = pad_right([x["ids"].long() for x in items], 0, t).to(dev)  # [B, T]
            mask = pad_right([x["mask"] for x in items], False, t).to(dev)
            dtype = model.embed.weight.dtype
            aux = _pad_rows([x["aux"] for x in items], t).to(dev, dtype)  # [B, T, k*H]
            hidden = _pad_rows([x["hidden"] for x in items], t).to(dev, dtype)  # [B, T, H]
        else:
            pairs = [self.source.get(i) for i in rows]
            t = self._length([p[0].numel() for p in pairs])
            ids = pad_right([p[0].long() for p in pairs], 0, t).to(dev)
            mask = pad_right([p[1] for p in pairs], False, t).to(dev)
            if self.cache is not None and all(i in self.cache for i in rows):
                kept = [self.cache.get(i) for i in rows]
                aux, hidden = _pad_rows([a for a, _ in kept], t), _pad_rows([h for _, h in kept], t)
            else:
                hidden, aux = model(ids, capture=self.capture.points)
                if self.cache is not None:
                    for r, (i, p) in enumerate(zip(rows, pairs)):
                        n = min(p[0].numel(), t)  # a row's own positions (a later batch is at least this long)
                        self.cache.put(i, aux[r, :n], hidden[r, :n])
        logits = model.logits(hidden)  # [B, T, V]
        top = logits.argmax(-1)  # [B, T]
        logp = logits.index_select(-1, self.draft_ids).float().log_softmax(-1)  # [B, T, Vd]
        return StepInputs(ids, mask, aux, model.embed(ids), logp, top)


def _pad_rows(xs: list[torch.Tensor], t: int) -> torch.Tensor:
    """[T_i, D] tensors -> [B, t, D], zero padded."""
    out = xs[0].new_zeros(len(xs), t, xs[0].shape[1])
    for i, x in enumerate(xs):
        out[i, : x.shape[0]] = x
    return out
