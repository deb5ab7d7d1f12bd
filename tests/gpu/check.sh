#!/usr/bin/env bash
# The device check, one script: configure and build with CUDA in build-gpu,
# run every test (the backend parity suite, labelled gpu, and the rest,
# whose servers --device auto puts on the GPU), PyTorch eager and in a
# CUDA graph (bench/torch_ref.py), forwards through a server on the GPU
# (bench/bench_gpu_http.py), the GPU benchmark beside them all, then
# compute-sanitizer memcheck, racecheck and initcheck on the parity
# suite's small cases, and the device gauges of /metrics.
#
# Optional baseline: when $ROOT/.baseline holds the source tree of an
# older commit (made with `mkdir .baseline && git archive COMMIT | tar -x
# -C .baseline`, ignored through .git/info/exclude and named in the device
# tool's carry list), its bench_gpu is built in build-baseline and run in
# the same session: bench-baseline.md, the code as it stood.
#
# Logs and results go to $OUT (else ./gpu-out), at most 8 files:
# summary.txt, build.log, ctest.log, peers.jsonl (PyTorch's and the HTTP
# rows), bench.md, sanitizer.log, run.log (the steps' stderr and the
# servers' logs) and bench-baseline.md. Every step runs under timeout,
# and the whole check under CHECK_BUDGET seconds (default 450, under 8
# minutes; a server's stop may add a few seconds past it): a step gets at
# most what is left, and one that would get too little is skipped and
# says so. On an H200 with 16 cores (2026-11-30) the
# steps before this version took: build 11 s, tests 32 s, PyTorch eager
# 10 s, benchmark 2 s.
# CHECK_QUICK=1, for a second try in the same device session: the build,
# the gpu-labelled tests (the parity suite), the benchmark and the device
# gauges only (no other tests, PyTorch, HTTP rows, sanitizer or baseline).
# Exit status: 2 when no GPU answers (nothing is built); else nonzero when
# the build, a test, a sanitizer run or a server on the device fails (the
# benchmark's times never fail the check).
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT_DIR=${OUT:-$ROOT/gpu-out}
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
DEADLINE=$((SECONDS + ${CHECK_BUDGET:-450}))
mkdir -p "$OUT_DIR"
SUMMARY=$OUT_DIR/summary.txt
RUNLOG=$OUT_DIR/run.log
SCRATCH=$(mktemp -d /tmp/ls-check.XXXXXX)
: >"$SUMMARY"
: >"$RUNLOG"
status=0
log() { echo "[check.sh $(date +%T)] $*" | tee -a "$SUMMARY"; }
fail() {
    log "$*"
    status=1
}

# bounded LIMIT CMD...: CMD under timeout, given at most LIMIT seconds and
# never past the check's deadline (10 s kept for the summary). Returns
# CMD's status, 124 on a timeout, 125 when too little time was left to
# start it.
bounded() {
    local limit=$1 left=$((DEADLINE - SECONDS - 10))
    shift
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        echo "check.sh: not run, the check's time is spent: $*" >>"$RUNLOG"
        return 125
    fi
    timeout "$limit" "$@"
}

# why RC: a word for a step's failure status.
why() {
    case $1 in
    124) echo "timed out" ;;
    77) echo "exit 77 (skipped: no CUDA device)" ;;
    125) echo "skipped: the check's time was spent" ;;
    *) echo "exit $1" ;;
    esac
}

# Stops server PID (SIGTERM, SIGKILL after 20 s, or sooner when the
# check's time is nearly spent: the wait stays bounded) and appends its
# log to run.log under a title.
stop_server() {
    local pid=$1 title=$2 slog=$3 waited=0 grace=$((DEADLINE - SECONDS - 5))
    [ "$grace" -gt 20 ] && grace=20
    [ "$grace" -lt 2 ] && grace=2
    kill "$pid" 2>/dev/null
    while [ "$waited" -lt "$grace" ]; do
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
        waited=$((waited + 1))
    done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    { echo "=== $title"; cat "$slog"; } >>"$RUNLOG"
}

# full_only WHAT: true unless CHECK_QUICK=1, which skips WHAT and says so.
QUICK=${CHECK_QUICK:-0}
full_only() {
    [ "$QUICK" = 1 ] || return 0
    log "$1: skipped (CHECK_QUICK=1)"
    return 1
}

# time_left_for SECONDS WHAT: true when the check has SECONDS left for a
# step that starts a server; else says the step is skipped.
time_left_for() {
    [ $((DEADLINE - SECONDS - 10)) -ge "$1" ] && return 0
    log "$2: skipped, the check's time was spent"
    return 1
}

# ---- the device -------------------------------------------------------------
# Without a GPU nothing here means anything: say so and stop before the
# build (minutes of CPU on a machine that cannot run it).
if ! gpus=$(nvidia-smi -L 2>&1) || ! grep -q "^GPU " <<<"$gpus"; then
    log "no CUDA device: nvidia-smi -L says: ${gpus:-nothing}"
    log "done, exit 2 (run this on a GPU machine)"
    rm -rf "$SCRATCH"
    exit 2
fi

# The device image cannot reach a package registry: build dependencies
# (libmicrohttpd, jansson, OpenBLAS, cmocka, curl -dev packages and their
# runtime libraries, pkgconf) may be carried as .deb files in $LS_DEPS_DIR
# (default .gpu-deps) and are unpacked under /tmp/ls-deps, never into /.
DEPS=${LS_DEPS_DIR:-$ROOT/.gpu-deps}
if compgen -G "$DEPS/*.deb" >/dev/null; then
    PREFIX=/tmp/ls-deps
    mkdir -p "$PREFIX"
    for f in "$DEPS"/*.deb; do dpkg -x "$f" "$PREFIX"; done
    # The .pc files name /usr; their private requirements (gnutls, ...)
    # only matter for static links and may be missing there.
    find "$PREFIX" -type f -name '*.pc' -exec sed -i -e '/^Requires.private:/d' \
        -e "s|=/usr|=$PREFIX/usr|g" -e "s|-I/usr|-I$PREFIX/usr|g" -e "s|-L/usr|-L$PREFIX/usr|g" {} +
    PKG_CONFIG_PATH=$(find "$PREFIX" -type d -name pkgconfig | paste -sd: -)${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    libdirs=$(find "$PREFIX" -name '*.so*' -printf '%h\n' | sort -u | paste -sd: -)
    LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    PATH=$PATH:$PREFIX/usr/bin # pkg-config, when the image has none
    # libgnutls28-dev's libgnutls.so names Debian's exact library file; the
    # image has its own libgnutls.so.30 (same ABI), which it is pointed at.
    while IFS= read -r so; do
        sys=$(ldconfig -p | awk '/libgnutls\.so\.30 .*x86-64/ {print $NF; exit}')
        [ -n "$sys" ] && ln -sf "$sys" "$so"
    done < <(find "$PREFIX" -name libgnutls.so -xtype l)
    export PKG_CONFIG_PATH LD_LIBRARY_PATH PATH
    log "unpacked $(find "$DEPS" -maxdepth 1 -name '*.deb' | wc -l) carried .deb files under $PREFIX"
fi

[ -x /usr/local/cuda/bin/nvcc ] && PATH=$PATH:/usr/local/cuda/bin
log "device"
{ nvidia-smi 2>&1; nvcc --version 2>&1; cmake --version 2>&1 | head -1; } >"$OUT_DIR/build.log"
grep -m1 -E "H200|H100|NVIDIA" "$OUT_DIR/build.log" | tee -a "$SUMMARY"

# ---- build ------------------------------------------------------------------
log "configure and build in $BUILD (-j$JOBS)"
start=$SECONDS
if ! {
    bounded "${BUILD_TIMEOUT:-150}" cmake -S "$ROOT" -B "$BUILD" -DLORASINK_CUDA=ON -DCMAKE_BUILD_TYPE=Release &&
        bounded "${BUILD_TIMEOUT:-150}" cmake --build "$BUILD" -j"$JOBS"
} >>"$OUT_DIR/build.log" 2>&1; then
    # Build what the check needs when another part of the tree is broken.
    fail "full build failed (see build.log); building the check's own targets"
    bounded "${BUILD_TIMEOUT:-150}" cmake --build "$BUILD" -j"$JOBS" --target backend_test_backend_parity bench_gpu \
        lorasink >>"$OUT_DIR/build.log" 2>&1 ||
        {
            log "build failed"
            tail -30 "$OUT_DIR/build.log" | tee -a "$SUMMARY"
            rm -rf "$SCRATCH"
            exit 1
        }
fi
log "built in $((SECONDS - start)) s"

# ---- tests ------------------------------------------------------------------
# The whole suite when everything built, else the parity suite alone.
start=$SECONDS
if [ "$status" -eq 0 ] && [ "$QUICK" != 1 ]; then
    log "ctest (every test)"
    (cd "$BUILD" && bounded "${TEST_TIMEOUT:-150}" ctest -j"$JOBS" --output-on-failure --verbose) >"$OUT_DIR/ctest.log" 2>&1
    rc=$?
else
    log "ctest -L gpu"
    (cd "$BUILD" && bounded "${TEST_TIMEOUT:-150}" ctest -L gpu --output-on-failure --verbose) >"$OUT_DIR/ctest.log" 2>&1
    rc=$?
fi
grep -E "SKIPPED|Skipped|checks,|tests passed|tests failed|\*\*\*Failed" "$OUT_DIR/ctest.log" | head -40 | tee -a "$SUMMARY"
log "tests: $(why $rc) in $((SECONDS - start)) s"
# Serving's CUDA graphs: the parity suite's checks of them, and the
# backend's warning when a capture or graph launch was refused.
log "CUDA graph checks passed: $(grep -cE "ok +.* CUDA graphs: " "$OUT_DIR/ctest.log")"
grep -E "FAIL .* CUDA graphs: |CUDA graph could not be captured|time_forward could not capture" "$OUT_DIR/ctest.log" |
    sort | uniq -c | head -8 | tee -a "$SUMMARY"
[ "$rc" -eq 0 ] || status=1
# On the device a skip means the GPU was not seen: that fails the check.
if grep -qE "\(Skipped\)|SKIPPED: no CUDA device" "$OUT_DIR/ctest.log"; then
    fail "the gpu tests were skipped: no CUDA device answered"
fi

# ---- peers: PyTorch, and the server over HTTP ----------------------------------
PEERS=$OUT_DIR/peers.jsonl
: >"$PEERS"
if full_only "PyTorch reference"; then
    log "PyTorch eager and CUDA-graph reference"
    start=$SECONDS
    PYTHONUNBUFFERED=1 bounded "${TORCH_TIMEOUT:-90}" python3 "$ROOT/bench/torch_ref.py" >>"$PEERS" 2>>"$RUNLOG" ||
        log "torch_ref.py: $(why $?); the torch columns stay empty or partial"
    log "torch_ref.py: $((SECONDS - start)) s"
fi

# The bench shape on the GPU, --max-rank 16 like bench_gpu's first group.
log "HTTP forwards through lorasink --device cuda"
start=$SECONDS
port=18732
slog=$SCRATCH/http-server.log
if full_only "HTTP rows" && time_left_for 40 "HTTP rows"; then
    "$BUILD/lorasink" --device cuda --demo --experts 2 --hidden 4096 --intermediate 2048 --layers 1 --dtype bf16 \
        --slots 8 --max-rank 16 --access-log=false --port $port >"$slog" 2>&1 &
    spid=$!
    LORASINK_URL=http://127.0.0.1:$port bounded 60 bash "$ROOT/scripts/wait-ready.sh" $spid "$slog" 60 >/dev/null 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        PYTHONUNBUFFERED=1 bounded "${HTTP_TIMEOUT:-60}" python3 "$ROOT/bench/bench_gpu_http.py" \
            --url http://127.0.0.1:$port >>"$PEERS" 2>>"$RUNLOG"
        rc=$?
        # A timeout is the clock's; any other failure is the server's answer.
        case $rc in 0) ;; 124 | 125) log "bench_gpu_http.py: $(why $rc)" ;; *) fail "bench_gpu_http.py failed: $(why $rc) (run.log)" ;; esac
    elif [ "$rc" -eq 125 ]; then
        log "HTTP rows: $(why $rc)"
    else
        fail "the HTTP server did not become ready on the device (run.log)"
    fi
    stop_server $spid "lorasink --device cuda for bench_gpu_http.py" "$slog"
fi
log "HTTP rows: $((SECONDS - start)) s"

# ---- the benchmark ----------------------------------------------------------
log "bench_gpu"
start=$SECONDS
bounded "${BENCH_TIMEOUT:-100}" "$BUILD/bench/bench_gpu" --torch "$PEERS" --http "$PEERS" >"$OUT_DIR/bench.md" 2>>"$RUNLOG"
rc=$?
[ "$rc" -eq 0 ] || log "bench_gpu: $(why $rc)"
tee -a "$SUMMARY" <"$OUT_DIR/bench.md"
log "bench_gpu: $((SECONDS - start)) s"

# ---- compute-sanitizer on the parity suite --------------------------------------
# Small cases only (the suite's argument picks the cases whose name holds
# it), each tool on each, the runs interleaved by case so that every tool
# covers "small" first when the sanitizer budget runs short.
SANLOG=$OUT_DIR/sanitizer.log
: >"$SANLOG"
CS=$(command -v compute-sanitizer)
for f in /usr/local/cuda*/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer; do
    [ -z "$CS" ] && [ -x "$f" ] && CS=$f
done
PARITY=$BUILD/tests/backend_test_backend_parity
[ -x "$PARITY" ] || PARITY=$(find "$BUILD" -type f -name backend_test_backend_parity -perm -u+x | head -1)
if ! full_only "compute-sanitizer"; then
    :
elif [ -z "$CS" ]; then
    log "compute-sanitizer: not found (PATH, /usr/local/cuda*/bin): no sanitizer runs"
elif [ -z "$PARITY" ]; then
    fail "compute-sanitizer: the parity suite (backend_test_backend_parity) was not built"
else
    log "compute-sanitizer ($CS) on $PARITY"
    san_end=$((SECONDS + ${SANITIZE_BUDGET:-150}))
    started=1
    for c in ${SANITIZE_CASES:-small odd tiny}; do
        for tool in memcheck racecheck initcheck; do
            [ "$started" -eq 1 ] || break 2
            left=$((san_end - SECONDS))
            if [ "$left" -lt 10 ]; then
                log "  $tool $c: not run, the sanitizer budget (${SANITIZE_BUDGET:-150} s) is spent"
                continue
            fi
            [ "$left" -gt 60 ] && left=60
            one=$SCRATCH/san.log
            # API errors the code handles (a refused graph capture, a
            # failed oversized allocation) are not memory errors.
            bounded "$left" "$CS" --tool "$tool" --error-exitcode 99 --report-api-errors no "$PARITY" "$c" >"$one" 2>&1
            rc=$?
            { echo "=== $tool $c: $(why $rc)"; cat "$one"; } >>"$SANLOG"
            said=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|checks, " "$one" | sed 's/^=* *//' | paste -sd ';' | sed 's/;/; /g')
            case $rc in
            0) log "  $tool $c: clean; $said" ;;
            99) fail "  $tool $c: errors found; $said (sanitizer.log)" ;;
            124 | 125) log "  $tool $c: $(why $rc) (sanitizer.log)" ;;
            *)
                # The sanitizer's own lines ("========= ...") say when it
                # refused the device; the suite's "N checks" line is no sign
                # it ran, since its host-side checks run without a device.
                if grep -qiE "^=+ .*(not supported|unable to|failed to|error 999|internal sanitizer error)|SKIPPED: no CUDA device" "$one"; then
                    log "  compute-sanitizer did not start here ($tool $c: $(why $rc): $(grep -m1 -iE '^=+ .*(not supported|unable to|failed to|error)|SKIPPED' "$one")); no sanitizer results"
                    started=0
                else
                    fail "  $tool $c: the parity suite failed under the sanitizer ($(why $rc)); $said (sanitizer.log)"
                fi
                ;;
            esac
        done
    done
fi

# ---- baseline: the code as it stood -------------------------------------------
if [ -d "$ROOT/.baseline" ] && full_only "baseline"; then
    log "baseline: bench_gpu of $ROOT/.baseline in $ROOT/build-baseline"
    start=$SECONDS
    if {
        bounded "${BUILD_TIMEOUT:-150}" cmake -S "$ROOT/.baseline" -B "$ROOT/build-baseline" -DLORASINK_CUDA=ON \
            -DCMAKE_BUILD_TYPE=Release &&
            bounded "${BUILD_TIMEOUT:-150}" cmake --build "$ROOT/build-baseline" -j"$JOBS" --target bench_gpu
    } >>"$OUT_DIR/build.log" 2>&1; then
        # An older bench_gpu reads the lines with "ms" it knows; the first
        # of each case is PyTorch eager's.
        bounded "${BENCH_TIMEOUT:-100}" "$ROOT/build-baseline/bench/bench_gpu" --torch "$PEERS" \
            >"$OUT_DIR/bench-baseline.md" 2>>"$RUNLOG"
        rc=$?
        [ "$rc" -eq 0 ] || log "baseline bench_gpu: $(why $rc)"
        tee -a "$SUMMARY" <"$OUT_DIR/bench-baseline.md"
    else
        log "baseline: its build failed (build.log); no bench-baseline.md"
    fi
    log "baseline: $((SECONDS - start)) s"
fi

# ---- the device gauges of /metrics ---------------------------------------------
# Memory, and utilisation through NVML, which has never run elsewhere: the
# server's warning says why one is absent.
log "device metrics"
port=18731
slog=$SCRATCH/metrics-server.log
if time_left_for 20 "device metrics"; then
    "$BUILD/lorasink" --device cuda --demo --port $port >"$slog" 2>&1 &
    spid=$!
    LORASINK_URL=http://127.0.0.1:$port bounded 60 bash "$ROOT/scripts/wait-ready.sh" $spid "$slog" 60 >/dev/null 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        bounded 10 curl -s http://127.0.0.1:$port/metrics | grep -E '^lorasink_device_' | tee -a "$SUMMARY"
        grep -i 'utilisation' "$slog" | tee -a "$SUMMARY"
    elif [ "$rc" -eq 125 ]; then
        log "device metrics: $(why $rc)"
    else
        fail "the server did not become ready on the device (run.log)"
    fi
    stop_server $spid "lorasink --device cuda --demo for /metrics" "$slog"
fi

rm -rf "$SCRATCH"
log "done in $SECONDS s, exit $status"
exit $status
