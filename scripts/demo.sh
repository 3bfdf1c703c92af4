#!/usr/bin/env bash
# The README's first command: install everything, start zerolayerd with the bundled model on
# loopback, send one signed invoke, print the streamed answer and its TTFT, stop the daemon.
#
#   bash scripts/demo.sh ["your question"]
#
# Everything it creates (a fresh key, the daemon's log) lives in a temporary directory that
# is removed on any exit; the daemon is stopped on any exit too.
# ZL_DEMO_READY_TIMEOUT: seconds to wait for the daemon (default 300; the very first start
# compiles the kernels, about a minute; later starts take seconds).
set -euo pipefail
cd "$(dirname "$0")/.."

question=${1:-"What is the capital of France?"}
ready_timeout=${ZL_DEMO_READY_TIMEOUT:-300}

bash scripts/bootstrap.sh

bin=.venv/bin
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zerolayer-demo.XXXXXX")
log=$tmp/zerolayerd.log
daemon_pid=

cleanup() {
  local rc=$?
  if [[ -n $daemon_pid ]] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$daemon_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$daemon_pid" 2>/dev/null || true
  fi
  if ((rc != 0)) && [[ -s $log ]]; then
    echo "demo: failed (exit $rc); the daemon's log:" >&2
    sed 's/^/  | /' "$log" >&2
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A fresh key, in a keys file created with mode 0600 (the daemon refuses anything looser).
"$bin/zerolayer" keygen --append "$tmp/keys" >/dev/null 2>&1
# Any free port for the metrics endpoint, so the demo never collides with a running daemon.
metrics_port=$("$bin/python" -c \
  'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

echo "demo: starting zerolayerd (the first start compiles the kernels, about a minute)"
# --network-port 0: the kernel picks a free UDP port; the ready line says which.
"$bin/zerolayerd" --network-host 127.0.0.1 --network-port 0 \
  --metrics-port "$metrics_port" --security-keys-file "$tmp/keys" 2>"$log" &
daemon_pid=$!

port=
deadline=$((SECONDS + ready_timeout))
while [[ -z $port ]]; do
  if ! kill -0 "$daemon_pid" 2>/dev/null; then
    rc=0
    wait "$daemon_pid" || rc=$?
    echo "demo: zerolayerd exited with status $rc before it was ready" >&2
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    echo "demo: zerolayerd not ready after ${ready_timeout} s" >&2
    exit 1
  fi
  sleep 0.2
  port=$(sed -n 's/^zerolayerd: ready on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$log")
done
sed 's/^/  | /' "$log"

echo "demo: zerolayer invoke -v \"$question\""
"$bin/zerolayer" invoke -v --addr "127.0.0.1:$port" --keys-file "$tmp/keys" "$question"

echo "demo: stopping zerolayerd (SIGTERM drains, then it exits)"
kill -TERM "$daemon_pid"
rc=0
wait "$daemon_pid" || rc=$?
daemon_pid=
tail -n 2 "$log" | sed 's/^/  | /'
if ((rc != 0)); then
  echo "demo: zerolayerd exited with status $rc" >&2
  exit 1
fi
echo "demo: ok (metrics were on http://127.0.0.1:$metrics_port/metrics while it ran)"
