#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz/ with clang into build-fuzz/
# and runs each for SECONDS (default 30), one after the other, one process
# each, on a temporary copy of its seeds (tests/fuzz/corpus/HARNESS, which
# is never written; tests/data/hostile is read too where it applies).
# HARNESS... picks some (default: all). Prints one line per harness and
# exits 1 when any found a crash, a leak, undefined behaviour or a
# timeout; the input that did it is in build-fuzz/findings/HARNESS/
# (docs/fuzzing.md). Needs clang (scripts/install-deps.sh --test installs it).
#   scripts/fuzz.sh [SECONDS] [HARNESS...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
shift || true
if ! [[ $secs =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS] [HARNESS...]" >&2
  exit 2
fi
all=(fuzz_safetensors fuzz_forward_json fuzz_forward_safetensors fuzz_adapter_upload_json fuzz_adapter_upload_raw
     fuzz_adapter_normalise fuzz_peft_config fuzz_config fuzz_api_keys)
harnesses=("${all[@]}")
[ $# -gt 0 ] && harnesses=("$@")
if ! command -v clang >/dev/null; then
  echo "fuzz: clang not found (scripts/install-deps.sh --test installs it)" >&2
  exit 2
fi

dir=build-fuzz
jobs=$(nproc 2>/dev/null || echo 2)
CC=clang cmake -S . -B "$dir" -DCMAKE_C_COMPILER=clang -DLORASINK_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DLORASINK_WERROR=ON >/dev/null
cmake --build "$dir" -j"$jobs" --target "${harnesses[@]}" >/dev/null

work=$(mktemp -d "${TMPDIR:-/tmp}/lorasink-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
failed=0
for h in "${harnesses[@]}"; do
  corpus=$work/$h
  mkdir -p "$corpus" "$dir/findings/$h"
  if [ -d "tests/fuzz/corpus/$h" ]; then cp tests/fuzz/corpus/"$h"/* "$corpus"/; fi
  args=(-max_total_time="$secs" -timeout=25 -print_final_stats=1 -artifact_prefix="$dir/findings/$h/")
  case $h in
    fuzz_safetensors) seeds=(tests/data/hostile) ;;
    fuzz_adapter_upload_raw | fuzz_adapter_normalise | fuzz_forward_safetensors)
      seeds=(tests/data/hostile); args+=(-dict=tests/fuzz/json.dict) ;;
    *) seeds=(); args+=(-dict=tests/fuzz/json.dict) ;;
  esac
  log=$work/$h.log
  rc=0
  TMPDIR=$work "$dir/tests/fuzz/$h" "${args[@]}" "$corpus" "${seeds[@]}" >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  # A harness that fails on its seeds prints no stats: || true, or set -e
  # would end the script here without saying which one failed.
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    result=ok
  else
    failed=1
    result="FAILED (exit $rc): $(grep -m1 -E '^(==[0-9]+==)?ERROR|^SUMMARY|runtime error' "$log" || echo "see the log below")"
    tail -n 60 "$log" >&2
    ls "$dir/findings/$h" >&2
  fi
  printf '%-26s %4ss  runs %9s  cov %5s  ft %6s  rss %5s MB  %s\n' "$h" "$secs" "${runs:-?}" "${cov:-?}" "${ft:-?}" \
    "${rss:-?}" "$result"
done
exit $failed
