"""Sampling settings and the token distribution they define.

``probs`` is the single definition of "the distribution the user asked for"
(temperature, then top-k, then top-p). Plain sampling draws from it, and speculative
acceptance compares draft and target through it, which is what makes speculative
sampling reproduce plain sampling exactly in distribution.
"""

from __future__ import annotations

import torch

from eaglet.options import SamplingParams


def probs(logits: torch.Tensor, p: SamplingParams, temperature: torch.Tensor | None = None) -> torch.Tensor:
    """logits [..., V] -> float32 probabilities [..., V] after temperature, top-k, top-p.

    ``temperature`` [...]: one per row instead of ``p.temperature`` (rows that sample on their own).
    """
    t = max(p.temperature, 1e-6) if temperature is None else temperature.clamp_min(1e-6).unsqueeze(-1)
    x = logits.float() / t
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


def sample_at(logits: torch.Tensor, temperature: torch.Tensor, uniform: torch.Tensor, p: SamplingParams
              ) -> torch.Tensor:
    """logits [B, V] -> token ids [B], each row drawn with its own ``temperature`` [B] (0 = greedy) at its
    own ``uniform`` [B] in [0, 1): the token whose interval of the CDF holds it (inverse-CDF sampling).

    A row's token is then a function of its logits and its uniform alone, whatever rows share the
    batch (``torch.multinomial`` draws every row from one generator stream). Top-k and top-p are ``p``'s.
    """
    pr = probs(logits, p, temperature).double()  # float64: the CDF of 50k tokens keeps its small ones
    cdf = pr.cumsum(-1)  # [B, V]
    # Scaled to the CDF's own total, so rounding never lets u pass its end; zero-probability tokens
    # add nothing to the CDF, so the first entry above u is never one of them.
    at = (uniform.to(cdf).unsqueeze(-1) * cdf[:, -1:])  # [B, 1]
    drawn = torch.searchsorted(cdf, at, right=True).squeeze(-1).clamp_max(logits.shape[-1] - 1)
    return torch.where(temperature > 0, drawn, logits.argmax(-1))
