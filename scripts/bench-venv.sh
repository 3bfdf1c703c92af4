#!/usr/bin/env bash
# The peers' Python environment, .venv-bench, kept apart from .venv so that a peer's
# dependencies never change what zerolayer runs on. Idempotent: each part is installed once.
#
#   bash scripts/bench-venv.sh http       # uvicorn + FastAPI: bench_xdp.py's HTTP /health peer
#   bash scripts/bench-venv.sh llamacpp   # llama-cpp-python: scripts/make_golden.py
#                                         # (compiles llama.cpp: minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-bench
[ $# -gt 0 ] || set -- http
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
pip_in() { "$VENV/bin/pip" install --quiet --disable-pip-version-check "$@"; }
for part in "$@"; do
    case "$part" in
        http)
            "$VENV/bin/python" -c "import fastapi, uvicorn" 2>/dev/null \
                || pip_in "fastapi>=0.110" "uvicorn>=0.30" ;;
        llamacpp)
            "$VENV/bin/python" -c "import llama_cpp.server" 2>/dev/null \
                || pip_in numpy jinja2 diskcache "llama-cpp-python[server]==0.3.36" ;;
        *) echo "unknown part: $part (http | llamacpp)" >&2; exit 2 ;;
    esac
done
echo "$VENV ready: $*"
