#!/usr/bin/env bash
# Health at a glance: authenticated pings to zerolayerd, then the key numbers from its
# Prometheus endpoint (counters, in-flight gauges, latency histograms as mean/p50/p99).
#
#   scripts/zl-status.sh [--addr HOST:PORT] [--metrics URL] [--count N]
#
# The ping needs a key: it uses ZEROLAYER_KEY_ID/ZEROLAYER_SECRET or ZEROLAYER_KEYS_FILE if
# set, else the daemon's keys file /etc/zerolayer/keys (readable by root or the daemon's
# user only). Defaults: --addr 127.0.0.1:7433 (or $ZEROLAYER_ADDR),
# --metrics http://127.0.0.1:9433/metrics. Exit status 0 when both answered, 1 otherwise.
# Environment: ZEROLAYER_BIN (the zerolayer CLI; default: on PATH, else the repo's .venv).
set -euo pipefail

addr=${ZEROLAYER_ADDR:-127.0.0.1:7433}
metrics_url=http://127.0.0.1:9433/metrics
count=3

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
  exit "${1:-0}"
}

while (($#)); do
  case $1 in
    --addr) addr=${2:?--addr needs HOST:PORT}; shift 2 ;;
    --metrics) metrics_url=${2:?--metrics needs a URL}; shift 2 ;;
    --count) count=${2:?--count needs a number}; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "zl-status: unknown argument: $1" >&2; usage 2 >&2 ;;
  esac
done

repo=$(cd "$(dirname "$0")/.." && pwd)
zerolayer=${ZEROLAYER_BIN:-$(command -v zerolayer || echo "$repo/.venv/bin/zerolayer")}
status=0

echo "zerolayerd $addr"
if ! "$zerolayer" ping --addr "$addr" --count "$count" --interval 0.1 | sed 's/^/  /'; then
  status=1
fi

echo "metrics $metrics_url"
if ! text=$(curl -fsS --max-time 3 "$metrics_url"); then
  echo "  (no answer)"
  exit 1
fi

awk '
  # name{labels} value  →  remember values by name and label value
  /^#/ { next }
  {
    line = $0; value = $NF; sub(/ [^ ]+$/, "", line)
    name = line; label = ""
    if (i = index(line, "{")) {
      name = substr(line, 1, i - 1)
      label = substr(line, i + 1); sub(/}$/, "", label)
      nl = split(label, lp, "=\""); label = lp[nl]; sub(/"$/, "", label)   # last label value
    }
    v[name, label] = value + 0
    labels[name] = labels[name] (labels[name] == "" ? "" : SUBSEP) label
    if (name ~ /_bucket$/) {
      h = name; sub(/_bucket$/, "", h)
      nb[h]++; le[h, nb[h]] = label; cum[h, nb[h]] = value + 0
    }
  }
  function by_label(name, hide_zero,    out, parts, k, i, lab) {
    out = ""
    k = split(labels[name], parts, SUBSEP)
    for (i = 1; i <= k; i++) {
      lab = parts[i]
      if (hide_zero && v[name, lab] == 0) continue
      out = out sprintf("%s%s=%d", (out == "" ? "" : " "), lab, v[name, lab])
    }
    return out == "" ? (hide_zero ? "none" : "-") : out
  }
  function quantile(h, q,    total, rank, i, lo, hi, prev) {
    total = cum[h, nb[h]]
    if (total == 0) return "-"
    rank = q * total; prev = 0; lo = 0
    for (i = 1; i <= nb[h]; i++) {
      if (cum[h, i] >= rank) {
        if (le[h, i] == "+Inf") return sprintf(">%s", ms(lo))
        hi = le[h, i] + 0
        return ms(lo + (hi - lo) * (rank - prev) / (cum[h, i] - prev))
      }
      prev = cum[h, i]; lo = le[h, i] + 0
    }
  }
  function ms(s) { return s < 0.01 ? sprintf("%.3f ms", s * 1e3) : sprintf("%.1f ms", s * 1e3) }
  function hist(title, h,    n) {
    n = v[h "_count", ""]
    if (!((h "_count", "") in v)) return
    if (n == 0) { printf "  %-16s no samples yet\n", title; return }
    printf "  %-16s n=%d  mean %s  p50 %s  p99 %s\n", title, n, ms(v[h "_sum", ""] / n),
           quantile(h, 0.50), quantile(h, 0.99)
  }
  function one(title, name, fmt) {
    if ((name, "") in v) printf "  %-16s " fmt "\n", title, v[name, ""]
  }
  END {
    split(labels["zerolayer_build_info"], b, SUBSEP)
    printf "  %-16s %s\n", "version", (b[1] == "" ? "?" : b[1])
    printf "  %-16s %s\n", "requests", by_label("zerolayer_requests_total", 0)
    printf "  %-16s %s\n", "errors", by_label("zerolayer_request_errors_total", 1)
    printf "  %-16s running=%d waiting=%d\n", "in flight",
           v["zerolayer_requests_running", ""], v["zerolayer_requests_waiting", ""]
    printf "  %-16s prompt=%d generated=%d\n", "tokens",
           v["zerolayer_prompt_tokens_total", ""], v["zerolayer_generated_tokens_total", ""]
    one("model runs", "zerolayer_model_runs_total", "%d")
    printf "  %-16s %s\n", "idempotent hits", by_label("zerolayer_idempotent_hits_total", 0)
    one("datagrams in", "zerolayer_ingress_datagrams_total", "%d")
    if (v["zerolayer_xdp_attached", ""] == 1) {
      printf "  %-16s %s\n", "xdp packets", by_label("zerolayer_xdp_packets_total", 1)
      one("xsk rx dropped", "zerolayer_xsk_rx_dropped_total", "%d")
    }
    if (("zerolayer_kv_cache_usage_ratio", "") in v)
      printf "  %-16s %.1f%%\n", "kv cache used", 100 * v["zerolayer_kv_cache_usage_ratio", ""]
    hist("ttft", "zerolayer_time_to_first_token_seconds")
    hist("inter-token", "zerolayer_inter_token_latency_seconds")
    hist("end to end", "zerolayer_e2e_request_latency_seconds")
  }
' <<<"$text"
exit "$status"
