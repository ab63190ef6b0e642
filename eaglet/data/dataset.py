"""Tokenized conversations as flat tensors, length-bucketed batches, and right padding.

Millions of tokens as Python lists would cost gigabytes; here a dataset is three
tensors (ids, loss mask, offsets), saved and loaded as one safetensors file so that
DDP ranks and resumed runs share one tokenization.

Batches hold conversations of similar length up to a token budget (padded length x
rows), so padding stays small without packing several conversations into one row
(which would need a block-diagonal mask in the target's forward).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eaglet.data.template import Tokenized
from eaglet.errors import EagletError
from eaglet.outputs import atomic_file


@dataclass
class TokenData:
    ids: torch.Tensor  # [N_tok] int32, conversations back to back
    mask: torch.Tensor  # [N_tok] bool, assistant tokens
    offsets: torch.Tensor  # [n + 1] int64: conversation i is ids[offsets[i]:offsets[i+1]]

    @classmethod
    def from_tokenized(cls, items: Sequence[Tokenized]) -> TokenData:
        lengths = [len(t.ids) for t in items]
        offsets = torch.zeros(len(items) + 1, dtype=torch.long)
        offsets[1:] = torch.tensor(lengths, dtype=torch.long).cumsum(0)
        ids = torch.tensor([i for t in items for i in t.ids], dtype=torch.int32)
        mask = torch.tensor([m for t in items for m in t.mask], dtype=torch.bool)
        return cls(ids, mask, offsets)

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    @property
    def lengths(self) -> list[int]:
        return (self.offsets[1:] - self.offsets[:-1]).tolist()

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.ids[a:b], self.mask[a:b]

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for t in (self.ids, self.mask, self.offsets):
            h.update(t.numpy().tobytes())
        return h.hexdigest()[:16]

    def save(self, path: Path, meta: dict) -> None:
        with atomic_file(path) as tmp:
            save_file({"ids": self.ids, "mask": self.mask.to(torch.uint8), "offsets": self.offsets}, str(tmp),
                      metadata={"eaglet": json.dumps(meta)})

    @classmethod
    def load(cls, path: Path) -> tuple[TokenData, dict]:
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = json.loads((f.metadata() or {}).get("eaglet", "{}"))
                data = cls(f.get_tensor("ids"), f.get_tensor("mask").bool(), f.get_tensor("offsets"))
        except Exception as e:  # a torn or foreign file: the caller re-tokenizes
            raise EagletError(f"cannot read tokenized data {path} ({e})") from None
        return data, meta


def length_batches(lengths: Sequence[int], max_tokens: int, seed: int, epoch: int = 0) -> list[list[int]]:
    """Indices grouped by similar length, each group's padded size (rows x longest) <= max_tokens.

    Groups are shuffled with (seed, epoch); a conversation longer than max_tokens is a group alone.
    """
    rng = random.Random(seed * 100003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)  # ties in length land in a different group each epoch
    order.sort(key=lambda i: lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and lengths[i] * (len(cur) + 1) > max_tokens:  # sorted: lengths[i] is the new longest
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def pad_right(seqs: Sequence[torch.Tensor], value: int | bool = 0, length: int | None = None) -> torch.Tensor:
    """1-D tensors -> [B, T] right-padded to ``length`` or the longest (causal attention never sees the padding)."""
    t = max(length or 0, max(s.numel() for s in seqs))
    out = torch.full((len(seqs), t), value, dtype=seqs[0].dtype)
    for i, s in enumerate(seqs):
        out[i, : s.numel()] = s
    return out
