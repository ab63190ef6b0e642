"""TokenGaps (the inter-token latency histogram) exposes what prometheus_client's Histogram would, fed one
sample per token: the same buckets (bounds inclusive), count and sum."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from eaglet.serve.metrics import _BUCKETS, TokenGaps


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    lines = generate_latest(registry).decode().splitlines()
    return {k: float(v) for k, v in (x.rsplit(" ", 1) for x in lines if not x.startswith("#") and "_created" not in x)}


def test_token_gaps_equal_one_histogram_sample_per_token():
    plain, gaps = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("gap_seconds", "doc", buckets=_BUCKETS, registry=plain)
    ours = TokenGaps("gap_seconds", "doc", _BUCKETS, gaps)
    rng = random.Random(0)
    for _ in range(2000):
        # on a bound (inclusive), between bounds, below the first, above the last
        gap = rng.choice([rng.choice(_BUCKETS), rng.random() * 0.02, 1e-6, 100.0 * rng.random()])
        n = rng.randint(1, 7)
        for _ in range(n):
            reference.observe(gap)
        ours.observe(gap, n)
    want, got = _samples(plain), _samples(gaps)
    assert want.keys() == got.keys() and len(want) == len(_BUCKETS) + 3  # the buckets, +Inf, count, sum
    assert {k: v for k, v in got.items() if not k.endswith("_sum")} == \
        {k: v for k, v in want.items() if not k.endswith("_sum")}
    assert got["gap_seconds_sum"] == pytest.approx(want["gap_seconds_sum"], rel=1e-12)
