#!/usr/bin/env bash
# The running daemon's XDP program.
#
# Through its control socket (`zerolayer ctl`; root or the daemon's user):
#   scripts/zl-xdp.sh attach | detach       # attach/detach on [network] interface, no restart
#   scripts/zl-xdp.sh status                # attached?, queues, ports, rate, counters (JSON)
#   scripts/zl-xdp.sh rate PPS [BURST]      # the per-source limit, live (0: off)
#   scripts/zl-xdp.sh untagged-rate PPS [BURST]   # requests without the XDP tag, per CPU
# Through the maps it pinned ([network] xdp_pin_dir), with no daemon to ask:
#   scripts/zl-xdp.sh [--dir /sys/fs/bpf/zerolayer] show [--json]   # ports, rate limit, counters
#   scripts/zl-xdp.sh [--dir ...] rate PPS [BURST]                   # when no control socket
#   scripts/zl-xdp.sh [--dir ...] untagged-rate PPS [BURST]          # the same
#   scripts/zl-xdp.sh [--dir ...] reset-rate-state                   # every source starts full
#
# The pins need root (or CAP_BPF); exit status 2 when they can't be opened. Environment:
# ZEROLAYER_CONTROL_SOCKET (default /run/zerolayer/control.sock), ZEROLAYER_BIN (the
# zerolayer CLI), ZEROLAYER_PYTHON (default: the repo's .venv/bin/python, else python3).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${ZEROLAYER_PYTHON:-$repo/.venv/bin/python}
[[ -x $py ]] || py=python3
zerolayer=${ZEROLAYER_BIN:-$(command -v zerolayer || echo "$repo/.venv/bin/zerolayer")}
sock=${ZEROLAYER_CONTROL_SOCKET:-/run/zerolayer/control.sock}

case ${1:-} in
  attach | detach) exec "$zerolayer" ctl "xdp-$1" --socket "$sock" ;;
  status) exec "$zerolayer" ctl xdp-status --socket "$sock" ;;
  rate | untagged-rate)
    if [[ -S $sock ]]; then
      cmd=rate-limit
      [[ $1 == rate ]] || cmd=untagged-rate
      exec "$zerolayer" ctl "$cmd" "rate_pps=${2:?$1 needs PPS}" "burst=${3:-0}" \
        --socket "$sock"
    fi
    ;;
esac
exec "$py" -m zerolayer.bpf.pinned "$@"
