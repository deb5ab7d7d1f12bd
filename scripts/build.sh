#!/usr/bin/env bash
# Configures and builds lorasink into build/ (or $1), passing the rest of
# the arguments to cmake. The CUDA backend is built when nvcc is found.
# LORASINK_BUILD_TARGET=lorasink builds the server alone (no tests, no
# benchmarks), as the demo does.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLORASINK_WERROR=ON "$@" >/dev/null
if [ -n "${LORASINK_BUILD_TARGET:-}" ]; then
  cmake --build "$dir" -j"$jobs" --target "$LORASINK_BUILD_TARGET"
else
  cmake --build "$dir" -j"$jobs"
fi
