#!/usr/bin/env bash
# The one-shot GPU check (issue 5): on a machine with an NVIDIA GPU, run every CUDA kernel at
# SmolLM2-135M's shapes against its CPU twin, the whole forward pass against the CPU model,
# and the decode / prefill / launch timings (bench/gpu_bench.py). Writes gpu_check.json and
# gpu_check.log to $OUT (default bench/results) and prints a short table last. Budget: the
# benchmark stops starting sections after 420 s and is killed at 540 s.
#
# It uses the machine's own python3 and its numba / numba-cuda (no install, no network).
# The one package the GPU image lacks is gguf (pure Python); carry its wheel in .whl/:
#   echo /.whl/ >> .git/info/exclude
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: -d .whl gguf==0.19.0
# Extra arguments go to bench/gpu_bench.py (--sim: a logic check under the CUDA simulator).
# Exit status: 0 all checks passed, 1 a check failed or a section errored, 2 no GPU / setup.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"

if ! "$PY" -c 'import gguf' 2>/dev/null; then
  shopt -s nullglob
  wheels=(.whl/gguf-*.whl)
  if ((${#wheels[@]} == 0)); then
    echo "gpu-check: python package gguf missing; carry its wheel in .whl/ (see this script's header)" >&2
    exit 2
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/zl-site "${wheels[@]}"
  export PYTHONPATH=/tmp/zl-site${PYTHONPATH:+:$PYTHONPATH}
fi

# zerolayer.* without installing: the rooms under one namespace directory (see setup.py)
ns=$(mktemp -d)
mkdir -p "$ns/zerolayer"
for room in gpu daemon bpf; do ln -s "$PWD/$room" "$ns/zerolayer/$room"; done
export PYTHONPATH=$ns${PYTHONPATH:+:$PYTHONPATH}
# numba's OpenMP threading layer (gpu/__init__.py's default) only where the image has it
"$PY" -c 'from numba.np.ufunc import omppool' 2>/dev/null || export NUMBA_THREADING_LAYER=workqueue
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$OUT/gpu_check.log" || true
set +e
timeout 540 "$PY" bench/gpu_bench.py --out "$OUT" --budget-s 420 "$@" 2>&1 | tee -a "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}
echo "gpu-check: exit $rc ($OUT/gpu_check.json)"
exit "$rc"
