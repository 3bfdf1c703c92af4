#!/usr/bin/env bash
# The README's first command: install everything, start zerolayerd with the bundled model on
# loopback, send one signed invoke, print the streamed answer and its TTFT, stop the daemon.
#
#   bash scripts/demo.sh ["your question"]
#   bash scripts/demo.sh --ingress xdp ["your question"]     # as root: the XDP fast path
#
# With --ingress xdp the demo makes a private veth testbed (scripts/xdp-testbed.sh: two network
# namespaces, removed on exit), runs the daemon in one with the XDP program attached to its
# veth end and AF_XDP sockets on its queues, sends the invoke from the other, and prints the
# XDP program's counters.
#
# Everything it creates (a fresh key, the daemon's log) lives in a temporary directory that
# is removed on any exit; the daemon is stopped on any exit too.
# ZL_DEMO_READY_TIMEOUT: seconds to wait for the daemon (default 300; the very first start
# compiles the kernels, about a minute; later starts take seconds).
set -euo pipefail
cd "$(dirname "$0")/.."

ingress=udp
if [[ ${1:-} == --ingress ]]; then
  ingress=${2:?--ingress needs udp or xdp}
  shift 2
fi
case $ingress in
  udp) ;;
  xdp)
    if ((EUID != 0)); then
      echo "demo: --ingress xdp needs root (XDP, AF_XDP, network namespaces)" >&2
      exit 2
    fi
    ;;
  *) echo "demo: --ingress must be udp or xdp" >&2; exit 2 ;;
esac
question=${1:-"What is the capital of France?"}
ready_timeout=${ZL_DEMO_READY_TIMEOUT:-300}

bash scripts/bootstrap.sh

bin=.venv/bin
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zerolayer-demo.XXXXXX")
log=$tmp/zerolayerd.log
daemon_pid=
bed=

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
  if [[ -n $bed ]]; then
    bash scripts/xdp-testbed.sh down "$bed"
  fi
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

host=127.0.0.1
srv_exec=() cli_exec=()
extra=()
if [[ $ingress == xdp ]]; then
  bed="zldemo$$"
  bash scripts/xdp-testbed.sh up "$bed" >/dev/null
  srv_exec=(ip netns exec "$bed-srv") cli_exec=(ip netns exec "$bed-cli")
  host=10.201.0.1
  extra=(--network-ingress xdp --network-interface zl-s)
  echo "demo: testbed $bed-srv (daemon, veth zl-s $host) <-> $bed-cli (client)"
fi

echo "demo: starting zerolayerd (the first start compiles the kernels, about a minute)"
# --network-port 0: the kernel picks a free UDP port; the ready line says which.
"${srv_exec[@]}" "$bin/zerolayerd" --network-host "$host" --network-port 0 \
  --metrics-port "$metrics_port" --security-keys-file "$tmp/keys" "${extra[@]}" 2>"$log" &
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
  port=$(sed -n "s/^zerolayerd: ready on ${host//./\\.}:\([0-9][0-9]*\).*/\1/p" "$log")
done
sed 's/^/  | /' "$log"

echo "demo: zerolayer invoke -v \"$question\""
"${cli_exec[@]}" "$bin/zerolayer" invoke -v --addr "$host:$port" --keys-file "$tmp/keys" "$question"
if [[ $ingress == xdp ]]; then
  sleep 0.5  # the daemon copies the kernel's counters every 0.25 s
  echo "demo: the XDP program's counters (zerolayer_xdp_packets_total, non-zero):"
  "${srv_exec[@]}" "$bin/python" -c '
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
for line in text.splitlines():
    if line.startswith("zerolayer_xdp_packets_total{") and not line.endswith(" 0.0"):
        print("  |", line)
' "$metrics_port"
fi

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
