"""The draft vocabulary: the target tokens that answers actually use.

EAGLE-3 predicts over a reduced vocabulary (the most frequent tokens of the training
answers) so its LM head is small and fast; ``d2t``/``t2d`` map it back (see
``Eagle3Draft.set_vocab``). Training positions whose token lies outside are masked.
"""

from __future__ import annotations

import torch

from eaglet.draft.checkpoint import MAX_SHARD_BYTES


def default_draft_vocab_size(vocab_size: int, hidden_size: int, cap: int = 32768) -> int:
    """EAGLE-3's 32K, or for a small target the largest multiple of 4096 whose bf16 LM head fits one
    16 MiB shard, so its whole draft ships in 16 MiB shards (SmolLM2, hidden 576: 12288).

    Where that would leave fewer than 8192 tokens (hidden > 1024) the draft's layer weights
    outgrow 16 MiB anyway, and the vocabulary is not worth cutting for it.
    """
    fit = MAX_SHARD_BYTES // (2 * hidden_size) // 4096 * 4096
    return min(vocab_size, cap if fit < 8192 else min(fit, cap))


def token_counts(ids: torch.Tensor, mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """How often each target token occurs where ``mask`` is set: [vocab_size] int64."""
    return torch.bincount(ids[mask].long(), minlength=vocab_size)[:vocab_size]


def select_vocab(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` most frequent token ids, ascending; ties (and unseen fillers) go to lower ids."""
    order = torch.argsort(-counts, stable=True)  # descending count, ascending id within a count
    return torch.sort(order[:size]).values


def coverage(counts: torch.Tensor, ids: torch.Tensor) -> float:
    """Fraction of counted tokens that fall inside the vocabulary ``ids``."""
    total = int(counts.sum())
    return float(counts[ids].sum()) / total if total else 0.0
