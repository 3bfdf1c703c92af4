#!/usr/bin/env bash
# Drain zerolayerd without stopping it: new requests get DRAINING (clients retry them),
# requests in flight finish. Waits until none is in flight, then optionally stops the daemon.
#
#   scripts/zl-drain.sh [--socket PATH] [--timeout SECONDS] [--stop CMD] [--undrain]
#
# --socket   the control socket (default: $ZEROLAYER_CONTROL_SOCKET, else
#            /run/zerolayer/control.sock); run as root or as the daemon's user
# --timeout  give up waiting for in-flight requests after this long (default: 60)
# --stop     a command to run once drained, e.g. "systemctl stop zerolayerd"
# --undrain  end a drain instead (accept new requests again)
# Exit status: 0 drained (and stopped, with --stop); 1 requests still in flight at the
# timeout (the daemon stays drained); 2 usage; 3/4 the control call failed (zerolayer ctl's).
# Environment: ZEROLAYER_BIN (the zerolayer CLI; default: on PATH, else the repo's .venv).
set -euo pipefail

socket_path=${ZEROLAYER_CONTROL_SOCKET:-/run/zerolayer/control.sock}
timeout=60
stop_cmd=""
undrain=0

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
  exit "${1:-0}"
}

while (($#)); do
  case $1 in
    --socket) socket_path=${2:?--socket needs a path}; shift 2 ;;
    --timeout) timeout=${2:?--timeout needs seconds}; shift 2 ;;
    --stop) stop_cmd=${2:?--stop needs a command}; shift 2 ;;
    --undrain) undrain=1; shift ;;
    -h | --help) usage 0 ;;
    *) echo "zl-drain: unknown argument: $1" >&2; usage 2 >&2 ;;
  esac
done

repo=$(cd "$(dirname "$0")/.." && pwd)
zerolayer=${ZEROLAYER_BIN:-$(command -v zerolayer || echo "$repo/.venv/bin/zerolayer")}
ctl() { "$zerolayer" ctl "$1" --socket "$socket_path"; }

if ((undrain)); then
  ctl undrain >/dev/null
  echo "zl-drain: accepting new requests"
  exit 0
fi

ctl drain >/dev/null
echo "zl-drain: draining (new requests get DRAINING)"
deadline=$((SECONDS + timeout))
while :; do
  # the daemon's total (status also lists each engine's own): parsed as JSON, not grepped
  in_flight=$(ctl status | python3 -c 'import json, sys; print(json.load(sys.stdin)["requests"]["in_flight"])')
  [[ $in_flight == 0 ]] && break
  if ((SECONDS >= deadline)); then
    echo "zl-drain: $in_flight request(s) still in flight after ${timeout} s" >&2
    exit 1
  fi
  sleep 0.2
done
echo "zl-drain: drained, nothing in flight"
if [[ -n $stop_cmd ]]; then
  echo "zl-drain: $stop_cmd"
  bash -c "$stop_cmd"
fi
