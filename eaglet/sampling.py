"""Sampling settings and the token distribution they define.

``probs`` is the single definition of "the distribution the user asked for"
(temperature, then top-k, then top-p). Plain sampling draws from it, and speculative
acceptance compares draft and target through it, which is what makes speculative
sampling reproduce plain sampling exactly in distribution.
"""

from __future__ import annotations

import torch

from eaglet.options import SamplingParams


def probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> float32 probabilities [..., V] after temperature, top-k, top-p."""
    x = logits.float() / max(p.temperature, 1e-6)
    if p.top_k and p.top_k < x.shape[-1]:
        kth = torch.topk(x, p.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if p.top_p < 1:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        sorted_p = sorted_x.softmax(-1)
        # Drop a token when the tokens strictly before it already reach top_p.
        drop = (sorted_p.cumsum(-1) - sorted_p) >= p.top_p
        x = x.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return x.softmax(-1)


def sample(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None = None) -> torch.Tensor:
    """logits [B, V] -> token ids [B]."""
    if p.greedy:
        return logits.argmax(-1)
    return torch.multinomial(probs(logits, p), 1, generator=gen).squeeze(-1)
