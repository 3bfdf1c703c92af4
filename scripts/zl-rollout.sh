#!/usr/bin/env bash
# A zero-loss restart of zerolayerd (a new version, a new configuration): drain, wait for the
# requests in flight to finish, restart, wait until the new process is ready, undrain.
# Clients retry DRAINING by design (with a 45 s recovery window), so no request is lost: each
# one completes, or is refused DRAINING and completes on its retry.
#
#   scripts/zl-rollout.sh [--socket PATH] [--restart CMD] [--ready-url URL] [--timeout S]
#
# --socket     the control socket (default: $ZEROLAYER_CONTROL_SOCKET, else
#              /run/zerolayer/control.sock)
# --restart    how to restart (default: "systemctl restart zerolayerd"); it must return once
#              the old process is gone (systemctl does: the drain ends at once, nothing is
#              in flight)
# --ready-url  polled until it answers 200 (default: http://127.0.0.1:9433/readyz)
# --timeout    for each wait: in flight to reach 0, then readiness (default: 120)
# Exit status: 0 done; 1 a wait timed out (after a failed restart the old daemon is
# undrained again); 2 usage.
# Environment: ZEROLAYER_BIN (the zerolayer CLI; default: on PATH, else the repo's .venv).
set -euo pipefail

socket_path=${ZEROLAYER_CONTROL_SOCKET:-/run/zerolayer/control.sock}
restart_cmd="systemctl restart zerolayerd"
ready_url=http://127.0.0.1:9433/readyz
timeout=120

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
  exit "${1:-0}"
}

while (($#)); do
  case $1 in
    --socket) socket_path=${2:?--socket needs a path}; shift 2 ;;
    --restart) restart_cmd=${2:?--restart needs a command}; shift 2 ;;
    --ready-url) ready_url=${2:?--ready-url needs a URL}; shift 2 ;;
    --timeout) timeout=${2:?--timeout needs seconds}; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "zl-rollout: unknown argument: $1" >&2; usage 2 >&2 ;;
  esac
done

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
zerolayer=${ZEROLAYER_BIN:-$(command -v zerolayer || echo "$repo/.venv/bin/zerolayer")}
export ZEROLAYER_BIN=$zerolayer

ready() {
  python3 - "$ready_url" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

if ! "$here/zl-drain.sh" --socket "$socket_path" --timeout "$timeout"; then
  echo "zl-rollout: not drained in time; undraining, nothing restarted" >&2
  "$zerolayer" ctl undrain --socket "$socket_path" >/dev/null || true
  exit 1
fi
echo "zl-rollout: $restart_cmd"
if ! bash -c "$restart_cmd"; then
  echo "zl-rollout: the restart failed; undraining the old daemon" >&2
  "$zerolayer" ctl undrain --socket "$socket_path" >/dev/null || true
  exit 1
fi
deadline=$((SECONDS + timeout))
until ready; do
  if ((SECONDS >= deadline)); then
    echo "zl-rollout: not ready after ${timeout} s ($ready_url)" >&2
    exit 1
  fi
  sleep 0.2
done
# A fresh process starts undrained; this ends the drain if the restart kept the old one.
"$zerolayer" ctl undrain --socket "$socket_path" >/dev/null
echo "zl-rollout: ready and accepting requests"
