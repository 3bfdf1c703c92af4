#!/usr/bin/env bash
# Builds the benchmarks' peer: llama.cpp's own native `llama-server`, `llama-bench`,
# `llama-quantize`, `llama-perplexity` (whose KL divergence against a base model's logits
# bench/accuracy.py sets beside ours) and `llama-lookup` (n-gram lookup decoding, the peer of
# bench/bench_speculative.py), from the llama.cpp sources vendored in the
# llama-cpp-python 0.3.36 sdist (the same llama.cpp the earlier runtime benchmarks used, now
# without its Python wrapper, which serialises requests). Output: .bench-llamacpp/bin/ (git-ignored). About 10 minutes
# on 2 cores; safe to run again (an existing build is kept).
#
# ZEROLAYER_LLAMACPP_CPU=avx2 builds for an AVX2 machine instead of this one (no AVX-512,
# VNNI or AMX), into .bench-llamacpp-avx2/: the peer for our kernels compiled for an AVX2
# target (NUMBA_CPU_NAME=haswell, bench/README.md), so a machine flag set without VNNI is
# measured on any x86 host.
#
# ZEROLAYER_LLAMACPP_TARGETS="llama-perplexity llama-quantize" builds only those (the
# accuracy harness needs no server; a few minutes less).
set -euo pipefail
cd "$(dirname "$0")/.."
CPU=${ZEROLAYER_LLAMACPP_CPU:-native}
case "$CPU" in
  native) CPU_FLAGS=(-DGGML_NATIVE=ON); DEFAULT_OUT=.bench-llamacpp ;;
  avx2) CPU_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                   -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF
                   -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF
                   -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF); DEFAULT_OUT=.bench-llamacpp-avx2 ;;
  *) echo "setup_llamacpp: ZEROLAYER_LLAMACPP_CPU=$CPU is not native or avx2" >&2; exit 2 ;;
esac
OUT=${ZEROLAYER_LLAMACPP_DIR:-$DEFAULT_OUT}
read -r -a TARGETS <<<"${ZEROLAYER_LLAMACPP_TARGETS:-llama-server llama-bench llama-quantize llama-perplexity llama-lookup}"
missing=()
for t in "${TARGETS[@]}"; do [ -x "$OUT/bin/$t" ] || missing+=("$t"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup_llamacpp: already built in $OUT/bin"; exit 0
fi
command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake; }
mkdir -p "$OUT/src"
if [ ! -f "$OUT/src/llama_cpp_python-0.3.36.tar.gz" ]; then
  python3 -m pip download -q --no-binary :all: --no-deps -d "$OUT/src" llama-cpp-python==0.3.36
fi
if [ ! -d "$OUT/src/llama_cpp_python-0.3.36" ]; then
  tar -xzf "$OUT/src/llama_cpp_python-0.3.36.tar.gz" -C "$OUT/src"
fi
SRC="$OUT/src/llama_cpp_python-0.3.36/vendor/llama.cpp"
cmake -S "$SRC" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_CURL=OFF "${CPU_FLAGS[@]}" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF >"$OUT/cmake.log"
# only the missing ones: an older build gains llama-perplexity without rebuilding the rest
cmake --build "$OUT/build" -j2 --target "${missing[@]}" >"$OUT/build.log"
mkdir -p "$OUT/bin"
for t in "${missing[@]}"; do
  cp "$(find "$OUT/build" -type f -name "$t" -perm -u+x | head -1)" "$OUT/bin/$t"
done
echo "setup_llamacpp: built $(ls "$OUT/bin" | tr '\n' ' ')in $OUT/bin"
