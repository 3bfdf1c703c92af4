#!/usr/bin/env bash
# Health at a glance: authenticated pings to zerolayerd, the key numbers from its Prometheus
# endpoint (counters, in-flight gauges, latency histograms as mean/p50/p99, parsed by
# scripts/zl_metrics_summary.py with prometheus_client's parser), and `zerolayer ctl status`
# when the control socket is reachable.
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

python=$(dirname "$zerolayer")/python
[[ -x $python ]] || python=python3
"$python" "$repo/scripts/zl_metrics_summary.py" <<<"$text" || status=1

# The daemon's own view, when this user may reach its control socket (root or its user).
sock=${ZEROLAYER_CONTROL_SOCKET:-/run/zerolayer/control.sock}
if [[ -S $sock && -w $sock ]]; then
  echo "control $sock"
  "$zerolayer" ctl status --socket "$sock" | sed 's/^/  /' || status=1
fi
exit "$status"
