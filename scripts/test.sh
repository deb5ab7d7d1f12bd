#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: the default build
# (with the CUDA backend compiled and linked when nvcc is present; tests
# labelled gpu skip visibly without a device), then the ASan+UBSan build
# and the TSan build of the concurrency tests. --quick runs the first only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}

echo "== build (default) =="
bash scripts/build.sh build
echo "== tests (default build) =="
(cd build && ctest --output-on-failure -j"$jobs")

if [ "${1:-}" = "--quick" ]; then exit 0; fi

echo "== build (ASan+UBSan) =="
bash scripts/build.sh build-asan -DLORASINK_CUDA=OFF -DLORASINK_SANITIZE=address,undefined
echo "== tests (ASan+UBSan) =="
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j"$jobs" -LE gpu)

echo "== build (TSan) =="
bash scripts/build.sh build-tsan -DLORASINK_CUDA=OFF -DLORASINK_SANITIZE=thread
echo "== tests (TSan: concurrency) =="
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  OPENBLAS_NUM_THREADS=1 ctest --output-on-failure -j"$jobs" -L concurrency)
