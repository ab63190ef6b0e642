"""The server's Prometheus metrics (one registry per server, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Latency buckets from 1 ms (a fast inter-token gap) to a minute (a long queue wait on CPU).
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


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
        self.itl = Histogram("eaglet_inter_token_latency_seconds", "Gap between a row's outputs, per token "
                             "(a verify that emits n tokens counts its gap / n, n times)", buckets=_BUCKETS,
                             registry=r)
        self.verifies = Counter("eaglet_verifies", "Rows verified (one per row and speculative iteration)",
                                registry=r)
        self.accepted = Counter("eaglet_accepted_tokens", "Tokens emitted by verifies, bonus included: "
                                "accepted / verifies is the live accept length", registry=r)
        self.steps = Counter("eaglet_engine_steps", "Batch steps by what the policy chose: the tree "
                             "(steps, topk, nodes) or plain", ["mode"], registry=r)
