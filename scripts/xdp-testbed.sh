#!/usr/bin/env bash
# A private two-namespace testbed for the XDP fast path, used by the tests and the benchmark.
#
#   scripts/xdp-testbed.sh up NAME [QUEUES]   # creates NAME-srv and NAME-cli
#   scripts/xdp-testbed.sh down NAME          # removes both (and with them the veth pair)
#
#   NAME-srv: veth zl-s  10.201.0.1/24  fd7a:6c00::1/64   <- the daemon runs here (ip netns exec)
#   NAME-cli: veth zl-c  10.201.0.2/24  fd7a:6c00::2/64   <- clients run here
#
# Nothing is created in the caller's namespace, so the addresses can't clash with a real
# network, and deleting the two namespaces removes every device (and any XDP program
# attached to them). Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for `ip netns`).
set -euo pipefail

usage() { echo "usage: $0 up NAME [QUEUES] | down NAME" >&2; exit 2; }
[[ $# -ge 2 ]] || usage
cmd=$1 name=$2 queues=${3:-1}
srv="$name-srv" cli="$name-cli"

down() {
    ip netns del "$srv" 2>/dev/null || true
    ip netns del "$cli" 2>/dev/null || true
}

case "$cmd" in
up)
    down
    trap 'down' ERR
    ip netns add "$srv"
    ip netns add "$cli"
    ip -n "$srv" link add zl-s numtxqueues "$queues" numrxqueues "$queues" type veth \
        peer name zl-c netns "$cli" numtxqueues "$queues" numrxqueues "$queues"
    ip -n "$srv" addr add 10.201.0.1/24 dev zl-s
    ip -n "$cli" addr add 10.201.0.2/24 dev zl-c
    ip -n "$srv" addr add fd7a:6c00::1/64 dev zl-s nodad
    ip -n "$cli" addr add fd7a:6c00::2/64 dev zl-c nodad
    for ns in "$srv" "$cli"; do
        ip -n "$ns" link set lo up
    done
    ip -n "$srv" link set zl-s up
    ip -n "$cli" link set zl-c up
    echo "$srv $cli"
    ;;
down)
    down
    ;;
*)
    usage
    ;;
esac
