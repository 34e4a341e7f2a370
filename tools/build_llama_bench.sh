#!/usr/bin/env bash
# Builds llama.cpp's llama-bench (CPU only, Release) from the llama-cpp-python source package on PyPI, outside the
# repository, so `bench fast --llama-bench PATH` (or LLAMA_BENCH=PATH) can compare our decode with llama.cpp's on the
# course's own Q4_1 file. Needs cmake and g++; about 15 minutes on 2 cores. Prints the binary's path last.
# Usage: tools/build_llama_bench.sh [DIR]   (DIR defaults to /work/llama; PYTHON to the running python3)
set -euo pipefail
dir="${1:-/work/llama}"
python="${PYTHON:-python3}"
jobs="${JOBS:-2}"
mkdir -p "$dir"
cd "$dir"
tarball=$(ls llama_cpp_python-*.tar.gz 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$tarball" ]; then
  "$python" -m pip download --no-deps --no-binary :all: llama-cpp-python -d "$dir" >&2
  tarball=$(ls llama_cpp_python-*.tar.gz | sort -V | tail -1)
fi
src="${tarball%.tar.gz}"
[ -d "$src" ] || tar xzf "$tarball"
cmake -S "$src/vendor/llama.cpp" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DGGML_METAL=OFF \
  -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$src/build" --config Release --target llama-bench -j "$jobs" >&2
echo "$dir/$src/build/bin/llama-bench"
