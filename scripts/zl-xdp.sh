#!/usr/bin/env bash
# The running daemon's XDP program, through the maps it pinned ([network] xdp_pin_dir):
#
#   scripts/zl-xdp.sh [--dir /sys/fs/bpf/zerolayer] show [--json]   # ports, rate limit, counters
#   scripts/zl-xdp.sh [--dir ...] rate PPS [BURST]                   # change the limit live (0: off)
#   scripts/zl-xdp.sh [--dir ...] reset-rate-state                   # every source starts full
#
# Needs root (or CAP_BPF) to open the pins. Exit status 2 when they can't be opened.
# Environment: ZEROLAYER_PYTHON (default: the repo's .venv/bin/python, else python3).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${ZEROLAYER_PYTHON:-$repo/.venv/bin/python}
[[ -x $py ]] || py=python3
exec "$py" -m zerolayer.bpf.pinned "$@"
