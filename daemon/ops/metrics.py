"""Prometheus metrics for zerolayerd, in their own registry, served on 127.0.0.1.

Names follow Prometheus conventions: one `zerolayer_` prefix, base units (`_seconds`),
`_total` for counters, low-cardinality labels (an outcome, an error code, a kind).
Latency histograms start at 100 µs, because the quantities we care about (a PING, one
decode step on a GPU) live well below the 5 ms where default buckets begin.
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, make_wsgi_app
from prometheus_client.metrics_core import Metric

from zerolayer.gpu import __version__
from zerolayer.protocol.errors import ErrorCode

from ..carriers.carrier_metrics import CarrierMetrics, advance

if TYPE_CHECKING:
    from ..ingress import Ingress
    from ..result_cache import ResultCache

# What OVERLOADED can come from (docs/OPERATIONS.md "Error codes"): the nonce cache, one
# key's share of it, reassembly memory or slots, one key's share of those, the result
# cache, the hand-off to the engine thread, the engine's wait queue.
OVERLOAD_BOUNDS = ("nonce_cache", "nonce_key_share", "reassembly", "reassembly_key_share",
                   "result_cache", "admissions", "wait_queue")
STATES = ("warming", "ready", "draining")
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.requests = Counter("zerolayer_requests", "Finished requests by outcome",
                                ["outcome"], registry=r)
        self.errors = PulledCounter("zerolayer_request_errors",
                                    "Requests refused or failed, by error code", ["code"],
                                    registry=r)
        self.ttft = Histogram("zerolayer_time_to_first_token_seconds",
                              "First datagram received to first token's frame sent",
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
        self.backend = Gauge("zerolayer_model_backend_info",
                             "Where the model runs (set once at start; gpu/backend.py)",
                             ["backend", "device"], registry=r)
        self.datagrams = PulledCounter("zerolayer_ingress_datagrams", "Datagrams received",
                                       registry=r)
        self.idempotent = PulledCounter("zerolayer_idempotent_hits",
                                  "Duplicate request ids served without running the model",
                                  ["kind"], registry=r)
        self.model_runs = Counter("zerolayer_model_runs",
                                  "Requests that started: accepted by an engine (never one "
                                  "refused)", registry=r)
        self.kv_usage = Gauge("zerolayer_kv_cache_usage_ratio", "Fraction of KV arena blocks in use",
                              registry=r)
        # Per engine ([[engines]]; one engine is engine "0"): the label is the engine's index
        self.engine_up = Gauge("zerolayer_engine_up",
                               "1 while the engine serves, 0 once its thread died", ["engine"],
                               registry=r)
        self.engine_running = Gauge("zerolayer_engine_requests_running",
                                    "Requests in this engine's batch", ["engine"], registry=r)
        self.engine_waiting = Gauge("zerolayer_engine_requests_waiting",
                                    "Requests handed to this engine, waiting for its batch",
                                    ["engine"], registry=r)
        self.engine_kv_usage = Gauge("zerolayer_engine_kv_cache_usage_ratio",
                                     "Fraction of this engine's KV arena blocks in use",
                                     ["engine"], registry=r)
        self.engine_routed = Counter("zerolayer_engine_routed",
                                     "Requests handed to each engine, by why it was chosen: "
                                     "prefix (it served the payload's beginning) or load",
                                     ["engine", "reason"], registry=r)
        # the carriers' own series (XDP program, AF_XDP rings, UDP, shared memory)
        self.carriers = CarrierMetrics(r)
        self.handoff_full = Counter("zerolayer_handoff_full",
                                    "Hand-offs between the I/O and engine threads that found the "
                                    "queue full: admissions refused OVERLOADED, or engine waits "
                                    "for room for its events", ["queue"], registry=r)
        self.key_reloads = Counter("zerolayer_key_reloads", "Keys-file reloads (SIGHUP)",
                                   ["result"], registry=r)
        self.key_reload_success = Gauge("zerolayer_key_reload_last_success_timestamp_seconds",
                                        "Unix time of the last successful keys load (start or "
                                        "reload)", registry=r)
        for result in ("ok", "failed"):
            self.key_reloads.labels(result)
        # Refused datagrams and what they were answered with: a reply is never larger than
        # the datagram it answers (docs/PROTOCOL.md §6.5), so replies <= rejected, always.
        self.rejected_bytes = Counter("zerolayer_ingress_rejected_bytes",
                                      "Bytes of datagrams refused at ingress", registry=r)
        self.reply_bytes = Counter("zerolayer_ingress_rejection_reply_bytes",
                                   "Bytes of ERROR replies to refused datagrams", registry=r)
        self.replies_suppressed = Counter("zerolayer_ingress_replies_suppressed",
                                          "Refused datagrams left unanswered (not request-"
                                          "shaped, or too short for an ERROR)", registry=r)
        self.reassembly = Counter("zerolayer_reassembly_events",
                                  "Multi-fragment INVOKE reassembly, by event", ["event"],
                                  registry=r)
        self.memory = Gauge("zerolayer_memory_bytes",
                            "Bytes held by each bounded buffer (estimate)", ["buffer"],
                            registry=r)
        self.memory_limit = Gauge("zerolayer_memory_limit_bytes",
                                  "The most each buffer can hold, from the configuration",
                                  ["buffer"], registry=r)
        ProcessCollector(registry=r)  # process_resident_memory_bytes & co.
        self.state = Gauge("zerolayer_server_state",
                           "1 for the daemon's current state (warming, ready, draining)",
                           ["state"], registry=r)
        self.overloaded = Counter("zerolayer_overloaded",
                                  "OVERLOADED refusals by the bound that was full",
                                  ["bound"], registry=r)
        for bound in OVERLOAD_BOUNDS:
            self.overloaded.labels(bound)
        self.stage = Histogram("zerolayer_request_stage_seconds",
                               "Per-request time in each stage, as sent in DONE's timings: "
                               "queue (admitted to first scheduled), tokenize, prefill, "
                               "decode (all steps)", ["stage"], buckets=LATENCY_BUCKETS,
                               registry=r)
        self.token_gap = Histogram("zerolayer_token_gap_seconds",
                                   "Time between one token's text and the next of the same "
                                   "request, as framed for the client (every token)",
                                   buckets=LATENCY_BUCKETS, registry=r)
        self.step_max = Histogram("zerolayer_decode_step_max_seconds",
                                  "Slowest gap between two tokens of a request (jitter)",
                                  buckets=LATENCY_BUCKETS, registry=r)
        self.prefix_tokens = Counter("zerolayer_prefix_cache_tokens",
                                     "Prompt tokens found in the prefix cache (hit) or run "
                                     "through the model (miss)", ["result"], registry=r)
        for result in ("hit", "miss"):
            self.prefix_tokens.labels(result)
        self.speculative_tokens = Counter("zerolayer_speculative_tokens",
                                          "Speculative decoding: tokens guessed from the "
                                          "requests' own text (drafted) and kept after the "
                                          "model checked them (accepted); their ratio is the "
                                          "acceptance rate", ["result"], registry=r)
        for result in ("drafted", "accepted"):
            self.speculative_tokens.labels(result)
        self.events_out = Counter("zerolayer_lifecycle_events",
                                  "Request lifecycle events on the [control] events feed, "
                                  "by result: published, or dropped (a slow subscriber's "
                                  "queue was full)", ["result"], registry=r)
        for result in ("published", "dropped"):
            self.events_out.labels(result)
        self._ingress_last: dict = {}
        self._handoff_last: dict = {}
        for code in ErrorCode:  # every code is visible at 0 before its first occurrence
            self.errors.labels(code.name)
        for outcome in ("stop", "length", "cancelled", "error"):
            self.requests.labels(outcome)
        for kind in ("attached", "replayed"):
            self.idempotent.labels(kind)

    def update_engine(self, index: int, running: int, waiting: int, kv_usage: float,
                      up: bool) -> None:
        e = str(index)
        self.engine_up.labels(e).set(1 if up else 0)
        self.engine_running.labels(e).set(running)
        self.engine_waiting.labels(e).set(waiting)
        self.engine_kv_usage.labels(e).set(kv_usage)

    def update_handoff(self, queue: str, total: int) -> None:
        """Copy a hand-off's own count of full queues into the counter (as an increment)."""
        advance(self.handoff_full.labels(queue), self._handoff_last, queue, total)

    def pull_ingress(self, ingress: Ingress) -> None:
        """Count ingress's datagrams and refusals from its own plain ints (kept per datagram
        on the I/O thread), added in at each scrape."""
        self.datagrams.pull_from(lambda: {(): ingress.stats["datagrams"]})
        self.errors.pull_from(lambda: {(code.name,): n
                                       for code, n in list(ingress.errors.items()) if n})

    def pull_cache(self, cache: ResultCache) -> None:
        """Duplicate request ids answered from the result cache, as the cache counts them
        (ResultCache.lookup: attached to a running request, or replayed), at each scrape."""
        self.idempotent.pull_from(lambda: {(k,): cache.stats[k] for k in ("attached", "replayed")})

    def update_ingress(self, ingress: Ingress) -> None:
        """Copy ingress's and reassembly's own counts (plain ints on the hot path) into
        Prometheus, from the loop's housekeeping."""
        last, st = self._ingress_last, ingress.stats
        advance(self.rejected_bytes, last, "rejected", st["rejected_bytes"])
        advance(self.reply_bytes, last, "reply", st["reply_bytes"])
        advance(self.replies_suppressed, last, "suppressed", st["replies_suppressed"])
        for event, n in ingress.reassembler.stats.items():
            advance(self.reassembly.labels(event), last, ("reassembly", event), n)

    def update_events(self, result: str, total: int) -> None:
        advance(self.events_out.labels(result), self._ingress_last, ("events", result), total)

    def update_overloaded(self, totals: dict[str, int]) -> None:
        for bound, n in totals.items():
            advance(self.overloaded.labels(bound), self._ingress_last, ("overloaded", bound), n)

    def set_state(self, state: str) -> None:
        for s in STATES:
            self.state.labels(s).set(1 if s == state else 0)

    def update_memory(self, buffers: dict[str, tuple[int, int]]) -> None:
        for name, (used, limit) in buffers.items():
            self.memory.labels(name).set(used)
            self.memory_limit.labels(name).set(limit)

    def serve(self, host: str, port: int,
              ready: Callable[[], tuple[bool, str]] = lambda: (True, "ready")) -> None:
        """The metrics port: /metrics (Prometheus text), /healthz (200 while the process
        serves HTTP at all), /readyz (200 when READY, else 503 with the state: warming,
        draining). Anything else is 404. One thread per connection, daemon threads."""
        if not port:
            return
        metrics_app = make_wsgi_app(self.registry)

        def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                return metrics_app(environ, start_response)
            if path == "/healthz":
                status, body = "200 OK", "ok\n"
            elif path == "/readyz":
                ok, why = ready()  # ok: "ready", or "degraded: ..." (an engine died)
                status, body = ("200 OK" if ok else "503 Service Unavailable"), f"{why}\n"
            else:
                status, body = "404 Not Found", "not found: /metrics, /healthz, /readyz\n"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [body.encode()]

        server_cls = _Server6 if ":" in host else _Server
        httpd = make_server(host, port, app, server_cls, handler_class=_QuietHandler)
        threading.Thread(target=httpd.serve_forever, name="zerolayer-metrics",
                         daemon=True).start()


class PulledCounter(Counter):
    """A counter whose counts may also be kept as plain ints where they happen and are added
    in each time the registry is collected (every scrape), so no scrape sees it behind.

    For the I/O thread's per-datagram path, where Counter.inc (a lock, ~0.7 us here) and
    labels() (a lookup under another lock, ~2 us more) were a tenth to a third of a PING's
    whole receive-to-reply work. A source is
    a callable giving {label values: running total}; () for a counter without labels.
    Direct inc() calls still add as usual."""

    def pull_from(self, source: Callable[[], Mapping[tuple[str, ...], int]]) -> None:
        if "_sources" not in self.__dict__:   # set up here: Counter's __init__ stays its own
            self._sources: list[Callable[[], Mapping[tuple[str, ...], int]]] = []
            self._pulled: dict[tuple[int, tuple[str, ...]], int] = {}
            self._pull_lock = threading.Lock()   # two scrapes at once must not add twice
        self._sources.append(source)

    def pull(self) -> None:
        if "_sources" not in self.__dict__:
            return
        with self._pull_lock:
            for i, source in enumerate(self._sources):
                for labels, total in source().items():
                    key = (i, labels)
                    d = total - self._pulled.get(key, 0)
                    if d > 0:
                        (self.labels(*labels) if labels else self).inc(d)
                    self._pulled[key] = total

    def collect(self) -> Iterable[Metric]:
        self.pull()
        return super().collect()


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # scrapes every few seconds: no access log
        pass
