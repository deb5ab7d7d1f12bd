#!/usr/bin/env bash
# The device check, one script: configure and build with CUDA in build-gpu,
# run every test (the backend parity suite, labelled gpu, and the rest,
# whose servers --device auto puts on the GPU), then the GPU benchmark
# beside PyTorch eager.
# Logs and results go to $OUT (else ./gpu-out), at most 7 files. On an
# H200 with 16 cores (2026-11-30) it took under a minute: build 11 s,
# tests 32 s, PyTorch 10 s, benchmark 2 s. Each step is bounded:
# TEST_TIMEOUT (200 s), TORCH_TIMEOUT (80 s), BENCH_TIMEOUT (100 s).
# Exit status: nonzero when the build or a test fails (the benchmark never
# fails the check).
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT_DIR=${OUT:-$ROOT/gpu-out}
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
JOBS=${JOBS:-16}
mkdir -p "$OUT_DIR"
SUMMARY=$OUT_DIR/summary.txt
: >"$SUMMARY"
status=0
log() { echo "[check.sh $(date +%T)] $*" | tee -a "$SUMMARY"; }

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
    for so in $(find "$PREFIX" -name libgnutls.so -xtype l); do
        sys=$(ldconfig -p | awk '/libgnutls\.so\.30 .*x86-64/ {print $NF; exit}')
        [ -n "$sys" ] && ln -sf "$sys" "$so"
    done
    export PKG_CONFIG_PATH LD_LIBRARY_PATH PATH
    log "unpacked $(find "$DEPS" -maxdepth 1 -name '*.deb' | wc -l) carried .deb files under $PREFIX"
fi

[ -x /usr/local/cuda/bin/nvcc ] && PATH=$PATH:/usr/local/cuda/bin
log "device"
{ nvidia-smi 2>&1; nvcc --version 2>&1; cmake --version 2>&1 | head -1; } >"$OUT_DIR/nvidia-smi.txt"
grep -m1 -E "H200|H100|NVIDIA" "$OUT_DIR/nvidia-smi.txt" | tee -a "$SUMMARY"

log "configure and build in $BUILD (-j$JOBS)"
start=$SECONDS
if ! {
    cmake -S "$ROOT" -B "$BUILD" -DLORASINK_CUDA=ON -DCMAKE_BUILD_TYPE=Release &&
        cmake --build "$BUILD" -j"$JOBS"
} >"$OUT_DIR/build.log" 2>&1; then
    # Build what the check needs when another part of the tree is broken.
    log "full build failed (see build.log); building the check's own targets"
    status=1
    cmake --build "$BUILD" -j"$JOBS" --target backend_test_backend_parity bench_gpu >>"$OUT_DIR/build.log" 2>&1 ||
        { log "build failed"; tail -30 "$OUT_DIR/build.log" | tee -a "$SUMMARY"; exit 1; }
fi
log "built in $((SECONDS - start)) s"

# The whole suite when everything built, else the parity suite alone.
start=$SECONDS
if [ "$status" -eq 0 ]; then
    log "ctest (every test)"
    (cd "$BUILD" && timeout "${TEST_TIMEOUT:-200}" ctest -j"$JOBS" --output-on-failure --verbose) >"$OUT_DIR/ctest.log" 2>&1
    rc=$?
else
    log "ctest -L gpu"
    (cd "$BUILD" && timeout "${TEST_TIMEOUT:-200}" ctest -L gpu --output-on-failure --verbose) >"$OUT_DIR/ctest.log" 2>&1
    rc=$?
fi
grep -E "SKIPPED|Skipped|checks,|tests passed|tests failed|\*\*\*Failed" "$OUT_DIR/ctest.log" | head -40 | tee -a "$SUMMARY"
log "tests: exit $rc in $((SECONDS - start)) s"
[ "$rc" -eq 0 ] || status=1
# On the device a skip means the GPU was not seen: that fails the check.
if grep -qE "\(Skipped\)|SKIPPED: no CUDA device" "$OUT_DIR/ctest.log"; then
    log "the gpu tests were skipped: no CUDA device answered"
    status=1
fi

log "PyTorch eager reference"
start=$SECONDS
PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT:-80}" python3 "$ROOT/bench/torch_ref.py" >"$OUT_DIR/torch_ref.jsonl" 2>"$OUT_DIR/bench.log" ||
    log "torch_ref.py failed (exit $?); the torch columns stay empty"
log "torch_ref.py: $((SECONDS - start)) s"

log "bench_gpu"
start=$SECONDS
timeout "${BENCH_TIMEOUT:-100}" "$BUILD/bench/bench_gpu" --torch "$OUT_DIR/torch_ref.jsonl" >"$OUT_DIR/bench.md" 2>>"$OUT_DIR/bench.log" ||
    log "bench_gpu failed (exit $?)"
tee -a "$SUMMARY" <"$OUT_DIR/bench.md"
log "bench_gpu: $((SECONDS - start)) s"

# The device gauges of /metrics (memory, and utilisation through NVML,
# which has never run elsewhere): the server's warning says why one is absent.
log "device metrics"
port=18731
"$BUILD/lorasink" --device cuda --demo --port $port >"$OUT_DIR/server.log" 2>&1 &
spid=$!
if LORASINK_URL=http://127.0.0.1:$port bash "$ROOT/scripts/wait-ready.sh" $spid "$OUT_DIR/server.log" 60 >/dev/null; then
    curl -s http://127.0.0.1:$port/metrics | grep -E '^lorasink_device_' | tee -a "$SUMMARY"
    grep -i 'utilisation' "$OUT_DIR/server.log" | tee -a "$SUMMARY"
else
    log "the server did not become ready on the device (server.log)"
    status=1
fi
kill $spid 2>/dev/null; wait $spid 2>/dev/null

log "done, exit $status"
exit $status
