#!/usr/bin/env bash
# Configures and builds lorasink into build/ (or $1), passing the rest of
# the arguments to cmake. The CUDA backend is built when nvcc is found.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLORASINK_WERROR=ON "$@" >/dev/null
cmake --build "$dir" -j"$jobs"
