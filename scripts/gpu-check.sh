#!/usr/bin/env bash
# The one-shot GPU check, in one run: bench/gpu_bench.py (timings first: decode at batch 1,
# 16 and 64, prefill of 512 tokens, the device sampler, per-op times; then the checks: the
# forward pass against a float64 reference, CUDA graph replays against the launch path, every
# kernel against its CPU twin, the sampler, the mapped UMEM, TTFT through a real zerolayerd),
# then bench/gpu_peer.py (a plain PyTorch CUDA-graph Llama and HF eager generate in the same
# shapes), then one table: each measured value beside its target and the peers' ratio.
# The fused step kernel is checked three ways: grid_sync.selftest over one block per SM,
# launched cooperatively (the grid_barrier section); decode at batch 1 with the step cut as
# ZEROLAYER_CUDA_STEP_LAUNCH=step, =layer and =stage in turn, in the same process (step_cuts);
# and each stage's measured time beside gpu/cuda/step_plan.py's predicted one (stages: the
# prediction is a model, printed as such). Every section records the kernel path it ran on
# (the fused kernel, or per op and why), and the table lists any section that was not fused.
# Prefill of 512 tokens runs on cuBLAS (tensor cores) and on the fused kernel's token tiles,
# and their logits are compared (prefill_paths), beside gpu/cuda/prefill_plan.py's prediction.
# Writes gpu_check.json, gpu_peer.json, gpu_check_report.json and gpu_check.log to $OUT
# (default bench/results).
#
# Budget: 240 s from a cold machine, compilation included. gpu_bench starts no section after
# 160 s and is killed at 180 s (its results file is rewritten after every section, so a kill
# keeps what ran); the peers start nothing after 40 s and are killed at 50 s. The kernels
# compile first, in parallel worker processes (bench/gpu_warm.py), into a fresh Numba cache
# ($ZEROLAYER_CACHE_DIR, a new temporary directory unless set: a cold start is what is
# measured), while the weights and the float64 reference are built.
#
# It uses the machine's own python3 and its numpy / numba / numba-cuda / CuPy / torch /
# transformers (no network). The stock GPU image (Python 3.12) lacks gguf (the weights'
# formats: everything needs it), pyzmq and prometheus-client (the daemon of the TTFT
# section; pyroute2 is only the XDP path's, not used here). Carry their wheels in .whl/,
# which git ignores, so a copy of the tree to the GPU machine must name it (the device
# tool: carry [".whl"]):
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     gguf==0.19.0 pyzmq==27.3.0 prometheus-client==0.26.0 pyyaml==6.0.3
# Each module the machine lacks is installed from there into a new /tmp/zl-site.* (by pip
# where the image has it, else by unzipping the wheel; no dependencies, nothing over what the
# image has; pyyaml only if gguf's yaml is missing too), and must then import.
#
#   bash scripts/gpu-check.sh              # the check (exit 0: every section ran and passed)
#   bash scripts/gpu-check.sh --sim        # logic check under the CUDA simulator (minutes;
#                                          # the peers on the CPU at tiny shapes, if torch is there)
#   bash scripts/gpu-check.sh --deps-only  # only install what is missing, and say what
# Exit status: 0 all passed, 1 a check failed or a section errored, 2 no GPU / setup.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
start=$(date +%s)
SIM=0
DEPS_ONLY=0
args=()
for a in "$@"; do
  case "$a" in
    --sim) SIM=1; args+=("$a") ;;
    --deps-only) DEPS_ONLY=1 ;;
    *) args+=("$a") ;;
  esac
done

# module:distribution:required. Required ones stop the check; the others only fail the
# sections that import them.
# a new directory each run: a module left there by an earlier run (or unzipped for another
# Python) would shadow the image's own, PYTHONPATH coming first
SITE=$(mktemp -d /tmp/zl-site.XXXXXX)
install_wheel() {  # distribution name: pip picks the wheel that fits; without pip, unzip it
  if "$PY" -m pip --version >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --find-links .whl --target "$SITE" \
      "$1" 2>/dev/null
  else
    local w name=${1//-/_}
    shopt -s nullglob nocaseglob
    for w in .whl/"$name"-*.whl; do
      "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$w" "$SITE"
      break
    done
    shopt -u nullglob nocaseglob
  fi
}
missing_required=()
# (tokenizers and jinja2, the tokenizer's, come with the image's transformers and torch)
for spec in yaml:pyyaml:1 gguf:gguf:1 tokenizers:tokenizers:1 jinja2:jinja2:1 zmq:pyzmq:0 \
    prometheus_client:prometheus-client:0; do
  IFS=: read -r mod dist req <<<"$spec"
  if PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} "$PY" -c "import $mod" 2>/dev/null; then
    continue
  fi
  if install_wheel "$dist" && PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} "$PY" -c "import $mod" 2>/dev/null; then
    echo "gpu-check: installed $dist from .whl/ into $SITE"
  else
    echo "gpu-check: python module $mod missing and no usable $dist wheel in .whl/ (see this script's header)" >&2
    [[ $req == 1 ]] && missing_required+=("$dist")
  fi
done
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
if ((${#missing_required[@]})); then
  echo "gpu-check: cannot run without: ${missing_required[*]}" >&2
  exit 2
fi
((DEPS_ONLY)) && exit 0

# zerolayer.* without installing: each directory under one namespace directory, as setup.py
# maps them (gpu, daemon, bpf and protocol are rooms of their own; client/ is zerolayer.client)
ns=$(mktemp -d)
mkdir -p "$ns/zerolayer"
for room in gpu daemon bpf protocol client; do ln -s "$PWD/$room" "$ns/zerolayer/$room"; done
export PYTHONPATH=$ns:$PYTHONPATH
# numba's OpenMP threading layer (gpu/__init__.py's default) only where the image has it
"$PY" -c 'from numba.np.ufunc import omppool' 2>/dev/null || export NUMBA_THREADING_LAYER=workqueue
export PYTHONUNBUFFERED=1
export ZEROLAYER_CACHE_DIR=${ZEROLAYER_CACHE_DIR:-$(mktemp -d /tmp/zl-gpu-cache.XXXXXX)}

LOG=$OUT/gpu_check.log
: >"$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG" || true
set +e
if ((SIM)); then
  ZEROLAYER_GPU_BACKEND=sim "$PY" bench/gpu_bench.py --out "$OUT" "${args[@]}" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
else
  timeout -k 5 180 "$PY" bench/gpu_bench.py --out "$OUT" --budget-s 160 "${args[@]}" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
fi
peer_rc=0
rm -f "$OUT/gpu_peer.json"
if "$PY" -c 'import torch, transformers' 2>/dev/null; then
  if ((SIM)); then
    "$PY" bench/gpu_peer.py --out "$OUT" --device cpu --tiny 2>&1 | tee -a "$LOG"
  else
    timeout -k 5 50 "$PY" bench/gpu_peer.py --out "$OUT" --budget-s 40 2>&1 | tee -a "$LOG"
  fi
  peer_rc=${PIPESTATUS[0]}
else
  echo "gpu-check: no torch + transformers here: no peers in this run" | tee -a "$LOG"
fi
total=$(($(date +%s) - start))
echo | tee -a "$LOG"
table_args=(--table "$OUT" --total-s "$total")
((SIM)) && table_args+=(--sim)
"$PY" bench/gpu_bench.py "${table_args[@]}" 2>&1 | tee -a "$LOG"
echo "gpu-check: gpu_bench exit $rc, peers exit $peer_rc, $total s (results in $OUT)" | tee -a "$LOG"
((rc != 0)) && exit "$rc"
((peer_rc != 0)) && exit 1
exit 0
