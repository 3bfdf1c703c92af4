"""The edge's Prometheus metrics, all `zerolayer_http_*`, seconds as the unit of time.

A registry of its own (not prometheus_client's global one), so that tests can build several
apps in one process and the page shows only the edge's series. docs/OPERATIONS.md lists
every name (tests/test_http_edge.py checks it).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# TTFT of a small model on loopback is milliseconds; a loaded daemon, seconds.
_TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0,
                 10.0, 30.0)
_DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                     300.0)

APIS = ("chat_completions", "completions", "messages", "models")


class EdgeMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "zerolayer_http_requests", "HTTP requests answered, by API and HTTP status "
            "(a stream counts with the status it started with)", ["api", "status"], registry=r)
        self.duration = Histogram(
            "zerolayer_http_request_duration_seconds",
            "Request received -> response finished (a stream: its last event)", ["api"],
            buckets=_DURATION_BUCKETS, registry=r)
        self.ttft = Histogram(
            "zerolayer_http_time_to_first_token_seconds",
            "Request received -> first text chunk ready to send", ["api"],
            buckets=_TTFT_BUCKETS, registry=r)
        self.active_streams = Gauge(
            "zerolayer_http_active_streams", "SSE responses in progress", registry=r)
        self.cancels = Counter(
            "zerolayer_http_cancels", "Daemon requests cancelled because the HTTP client went "
            "away before the end", registry=r)
        self.stream_errors = Counter(
            "zerolayer_http_stream_errors", "Errors sent as an SSE error event after a stream "
            "had started", ["api"], registry=r)
        self.daemon_errors = Counter(
            "zerolayer_http_daemon_errors", "Daemon errors by wire code (timeout: no code)",
            ["code"], registry=r)
        self.completion_tokens = Counter(
            "zerolayer_http_completion_tokens", "Tokens generated for HTTP clients", ["api"],
            registry=r)
        # Show every API's zero series from the start: a rate() over a series that appears
        # only on the first request misses that request.
        for api in APIS:
            self.duration.labels(api)
            if api != "models":
                self.ttft.labels(api)
                self.stream_errors.labels(api)
                self.completion_tokens.labels(api)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
