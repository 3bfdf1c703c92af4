"""Prometheus metrics for zerolayerd, in their own registry, served on 127.0.0.1.

Names follow Prometheus conventions: one `zerolayer_` prefix, base units (`_seconds`),
`_total` for counters, low-cardinality labels (an outcome, an error code, a kind).
Latency histograms start at 100 µs, because the quantities we care about (a PING, one
decode step on a GPU) live well below the 5 ms where default buckets begin.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from zerolayer.gpu import __version__

from .errors import ErrorCode

LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.requests = Counter("zerolayer_requests", "Finished requests by outcome",
                                ["outcome"], registry=r)
        self.errors = Counter("zerolayer_request_errors", "Requests refused or failed, by error code",
                              ["code"], registry=r)
        self.ttft = Histogram("zerolayer_time_to_first_token_seconds",
                              "First datagram received to first token sampled",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("zerolayer_inter_token_latency_seconds",
                             "Mean time between tokens, per request", buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("zerolayer_e2e_request_latency_seconds",
                             "First datagram received to DONE", buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("zerolayer_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generated_tokens = Counter("zerolayer_generated_tokens", "Tokens generated", registry=r)
        self.running = Gauge("zerolayer_requests_running", "Requests in the engine's batch", registry=r)
        self.waiting = Gauge("zerolayer_requests_waiting", "Requests admitted, waiting for the batch",
                             registry=r)
        self.build = Gauge("zerolayer_build_info", "Build information", ["version"], registry=r)
        self.build.labels(__version__).set(1)
        self.datagrams = Counter("zerolayer_ingress_datagrams", "Datagrams received", registry=r)
        self.idempotent = Counter("zerolayer_idempotent_hits",
                                  "Duplicate request ids served without running the model",
                                  ["kind"], registry=r)
        self.model_runs = Counter("zerolayer_model_runs", "Requests handed to the engine", registry=r)
        self.kv_usage = Gauge("zerolayer_kv_cache_usage_ratio", "Fraction of KV arena blocks in use",
                              registry=r)
        for code in ErrorCode:  # every code is visible at 0 before its first occurrence
            self.errors.labels(code.name)
        for outcome in ("stop", "length", "cancelled", "error"):
            self.requests.labels(outcome)
        for kind in ("attached", "replayed"):
            self.idempotent.labels(kind)

    def serve(self, host: str, port: int) -> None:
        if port:
            start_http_server(port, addr=host, registry=self.registry)
