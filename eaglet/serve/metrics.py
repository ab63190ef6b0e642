"""The server's Prometheus metrics (one registry per server, so tests can run several)."""

from __future__ import annotations

import bisect
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

# Latency buckets from 1 ms (a fast inter-token gap) to a minute (a long queue wait on CPU).
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class TokenGaps:
    """A histogram with one sample per token, where a row's step that made n tokens after a gap g adds n samples
    of g / n in one call. (prometheus_client's Histogram takes one sample a call, each under its lock: ~1.6 us a
    token on the engine's thread, half a millisecond a step at batch 64 with 5 tokens a row.) Exposed as a
    Prometheus histogram by ``collect``, which the registry calls on a scrape."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...], registry: CollectorRegistry):
        self.name, self.documentation, self.bounds = name, documentation, list(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.lock = threading.Lock()  # the engine's thread observes, a scrape on the HTTP thread reads
        registry.register(self)

    def observe(self, value: float, n: int = 1) -> None:
        i = bisect.bisect_left(self.bounds, value)  # the first bucket whose bound is >= value ("le")
        with self.lock:
            self.counts[i] += n
            self.sum += value * n

    def collect(self):
        with self.lock:
            counts, total = list(self.counts), self.sum
        cumulative, seen = [], 0
        for bound, c in zip([*map(floatToGoString, self.bounds), "+Inf"], counts):
            seen += c
            cumulative.append((bound, seen))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=cumulative, sum_value=total)


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("eaglet_requests", "Requests by outcome: finished, aborted (client left), "
                                "bad_request (400), queue_full (429), error (500), shutdown (503)",
                                ["outcome"], registry=r)
        self.queue_depth = Gauge("eaglet_queue_depth", "Requests waiting for a row", registry=r)
        self.running = Gauge("eaglet_running_rows", "Rows decoding in the running batch", registry=r)
        self.batch_rows = Gauge("eaglet_batch_rows", "Rows of the running batch (its size)", registry=r)
        self.prompt_tokens = Counter("eaglet_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generated_tokens = Counter("eaglet_generation_tokens", "Tokens generated for requests", registry=r)
        self.ttft = Histogram("eaglet_time_to_first_token_seconds", "Arrival to first token", buckets=_BUCKETS,
                              registry=r)
        self.itl = TokenGaps("eaglet_inter_token_latency_seconds", "Gap between a row's outputs, per token "
                             "(a verify that emits n tokens counts its gap / n, n times)", _BUCKETS, r)
        self.verifies = Counter("eaglet_verifies", "Rows verified (one per row and speculative iteration)",
                                registry=r)
        self.accepted = Counter("eaglet_accepted_tokens", "Tokens emitted by verifies, bonus included: "
                                "accepted / verifies is the live accept length", registry=r)
        self.steps = Counter("eaglet_engine_steps", "Batch steps by what the policy chose: the tree "
                             "(steps, topk, nodes) or plain", ["mode"], registry=r)
