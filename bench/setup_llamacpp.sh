#!/usr/bin/env bash
# Builds the benchmarks' peer: llama.cpp's own native `llama-server`, `llama-bench` and
# `llama-quantize`, from the llama.cpp sources vendored in the llama-cpp-python 0.3.36 sdist
# (the same llama.cpp the earlier runtime benchmarks used, now without its Python wrapper,
# which serialises requests). Output: .bench-llamacpp/bin/ (git-ignored). About 10 minutes
# on 2 cores; safe to run again (an existing build is kept).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${ZEROLAYER_LLAMACPP_DIR:-.bench-llamacpp}
if [ -x "$OUT/bin/llama-server" ] && [ -x "$OUT/bin/llama-bench" ] && [ -x "$OUT/bin/llama-quantize" ]; then
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
  -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF >"$OUT/cmake.log"
cmake --build "$OUT/build" -j2 --target llama-server llama-bench llama-quantize >"$OUT/build.log"
mkdir -p "$OUT/bin"
for t in llama-server llama-bench llama-quantize; do
  cp "$(find "$OUT/build" -type f -name "$t" -perm -u+x | head -1)" "$OUT/bin/$t"
done
echo "setup_llamacpp: built $(ls "$OUT/bin" | tr '\n' ' ')in $OUT/bin"
