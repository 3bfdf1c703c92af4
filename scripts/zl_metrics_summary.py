#!/usr/bin/env python3
"""The key numbers of a zerolayerd /metrics text, for scripts/zl-status.sh: counters by label,
gauges, and latency histograms as n, mean, p50 and p99 (linear inside a bucket, as
Prometheus's histogram_quantile). Parsed with prometheus_client's own parser.

    zl_metrics_summary.py < metrics.txt
"""
from __future__ import annotations

import sys

from prometheus_client.parser import text_string_to_metric_families


def ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s < 0.01 else f"{s * 1e3:.1f} ms"


def quantile(buckets: list[tuple[float, float]], q: float) -> str:
    total = buckets[-1][1] if buckets else 0
    if not total:
        return "-"
    rank, prev, lo = q * total, 0.0, 0.0
    for le, cum in buckets:
        if cum >= rank:
            if le == float("inf"):
                return f">{ms(lo)}"
            return ms(lo + (le - lo) * (rank - prev) / max(cum - prev, 1e-12))
        prev, lo = cum, le
    return "-"


def main() -> int:
    fams = {f.name: f for f in text_string_to_metric_families(sys.stdin.read())}

    def samples(name: str, suffix: str = "") -> list:
        f = fams.get(name)
        return [s for s in f.samples if s.name == name + suffix] if f else []

    def by_label(name: str, label: str, hide_zero: bool) -> str:
        parts = [f"{s.labels[label]}={int(s.value)}" for s in samples(name, "_total")
                 if not (hide_zero and s.value == 0)]
        return " ".join(parts) or ("none" if hide_zero else "-")

    def value(name: str, suffix: str = "", **labels: str) -> float | None:
        for s in samples(name, suffix):
            if all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        return None

    def line(title: str, text: str) -> None:
        print(f"  {title:<16} {text}")

    build = samples("zerolayer_build_info")
    line("version", build[0].labels.get("version", "?") if build else "?")
    state = [s.labels["state"] for s in samples("zerolayer_server_state") if s.value == 1]
    line("state", state[0] if state else "?")
    line("requests", by_label("zerolayer_requests", "outcome", False))
    line("errors", by_label("zerolayer_request_errors", "code", True))
    line("overloaded by", by_label("zerolayer_overloaded", "bound", True))
    line("in flight", f"running={int(value('zerolayer_requests_running') or 0)} "
                      f"waiting={int(value('zerolayer_requests_waiting') or 0)}")
    line("tokens", f"prompt={int(value('zerolayer_prompt_tokens', '_total') or 0)} "
                   f"generated={int(value('zerolayer_generated_tokens', '_total') or 0)}")
    line("model runs", str(int(value("zerolayer_model_runs", "_total") or 0)))
    line("idempotent hits", by_label("zerolayer_idempotent_hits", "kind", False))
    line("datagrams in", str(int(value("zerolayer_ingress_datagrams", "_total") or 0)))
    if value("zerolayer_xdp_attached") == 1:
        parts = [f"{s.labels['reason']}={int(s.value)}"
                 for s in samples("zerolayer_xdp_packets", "_total") if s.value]
        line("xdp packets", " ".join(parts) or "none")
    kv = value("zerolayer_kv_cache_usage_ratio")
    if kv is not None:
        line("kv cache used", f"{100 * kv:.1f}%")
    rss = value("process_resident_memory_bytes")
    if rss is not None:
        line("rss", f"{rss / 1e6:.0f} MB")
    for title, name in (("ttft", "zerolayer_time_to_first_token_seconds"),
                        ("inter-token", "zerolayer_inter_token_latency_seconds"),
                        ("end to end", "zerolayer_e2e_request_latency_seconds")):
        n = value(name, "_count")
        if n is None:
            continue
        if not n:
            line(title, "no samples yet")
            continue
        buckets = sorted((float(s.labels["le"]), s.value) for s in samples(name, "_bucket"))
        line(title, f"n={int(n)}  mean {ms((value(name, '_sum') or 0) / n)}  "
                    f"p50 {quantile(buckets, 0.5)}  p99 {quantile(buckets, 0.99)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
