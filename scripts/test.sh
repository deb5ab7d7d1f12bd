#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: the default build
# (with the CUDA backend compiled and linked when nvcc is present; tests
# labelled gpu skip visibly without a device) twice, with and without
# OPENBLAS_CORETYPE=Haswell, then a Release build (compiled, warnings as
# errors), the ASan+UBSan build, the TSan build of the concurrency
# tests, and every libFuzzer harness for 30 s; then what a user meets
# beyond the binary: the README's Try it block as pasted, the OpenAPI
# document (validated, and schemathesis against a live server), the
# metrics under a real Prometheus and the dashboard in headless Chromium,
# three replicas behind HAProxy, the container image, transformers and peft,
# and the Python client. --quick runs the first pass only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
jobs=$(nproc 2>/dev/null || echo 2)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
passed=0 failed=0 skipped=0

# Runs ctest in a build dir (extra args passed on) and adds to the totals.
run_ctest() {
  local dir=$1
  shift
  local rc=0
  (cd "$dir" && ctest --output-on-failure -j"$jobs" "$@") 2>&1 | tee "$log" || rc=$?
  local total fail skip
  total=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2/p' "$log" | tail -1)
  fail=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -1)
  skip=$(grep -c '\*\*\*Skipped' "$log" || true)
  passed=$((passed + ${total:-0} - ${fail:-0} - skip))
  failed=$((failed + ${fail:-0}))
  skipped=$((skipped + skip))
  return $rc
}
summary() { echo "all builds: $passed passed, $failed failed, $skipped skipped"; }

echo "== build (default) =="
bash scripts/build.sh build -DLORASINK_TESTS=ON
# The CPU engine runs its own kernels, so no BLAS setting may change a bit
# of any result: the default build's suite runs with OpenBLAS left to pick
# its kernels and again with OPENBLAS_CORETYPE=Haswell (the kernels whose
# row blocks once broke batch invariance on some machines).
saved_core=${OPENBLAS_CORETYPE-} saved_l2=${OPENBLAS_L2_SIZE-}
had_core=${OPENBLAS_CORETYPE+1} had_l2=${OPENBLAS_L2_SIZE+1}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
echo "== tests (default build, OPENBLAS_CORETYPE unset) =="
run_ctest build || { summary; exit 1; }
if [ "${1:-}" != "--quick" ]; then
  echo "== tests (default build, OPENBLAS_CORETYPE=Haswell) =="
  OPENBLAS_CORETYPE=Haswell run_ctest build || { summary; exit 1; }
fi
[ -n "$had_core" ] && export OPENBLAS_CORETYPE=$saved_core
[ -n "$had_l2" ] && export OPENBLAS_L2_SIZE=$saved_l2

if [ "${1:-}" = "--quick" ]; then summary; exit 0; fi

# Optimisers warn about other things (-Wformat-truncation,
# -Wstringop-overread): the Release build must compile clean too.
echo "== build (Release, warnings are errors) =="
bash scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DLORASINK_CUDA=OFF

echo "== build (ASan+UBSan) =="
bash scripts/build.sh build-asan -DLORASINK_CUDA=OFF -DLORASINK_SANITIZE=address,undefined
echo "== tests (ASan+UBSan) =="
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest build-asan -LE gpu || { summary; exit 1; }

echo "== build (TSan) =="
bash scripts/build.sh build-tsan -DLORASINK_CUDA=OFF -DLORASINK_SANITIZE=thread
echo "== tests (TSan: concurrency) =="
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  run_ctest build-tsan -L concurrency || { summary; exit 1; }

# Every parser under libFuzzer with ASan+UBSan, from the seed corpora in
# tests/fuzz/corpus/, for a bounded time (docs/fuzzing.md has the long run).
echo "== fuzz (libFuzzer, 30 s a harness) =="
bash scripts/fuzz.sh 30 || { summary; echo "fuzz: a harness failed"; exit 1; }

# Each prints PASS lines and stops at its first failure; each counts as
# one test in the totals.
for check in "check-pyflakes.sh" "check-readme.sh build" "check-openapi.sh build" "check-dashboard.sh build" "check-scale.sh build" \
  "check-image.sh" "check-hf.sh build" "check-python.sh build"; do
  echo "== ${check%% *} =="
  # shellcheck disable=SC2086 # the build dir is a second word on purpose
  if bash scripts/$check; then passed=$((passed + 1)); else failed=$((failed + 1)); summary; exit 1; fi
done
summary
