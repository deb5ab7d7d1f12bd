#!/usr/bin/env bash
# Three lorasink replicas behind HAProxy (deploy/haproxy/), end to end, on
# loopback:
#   bash scripts/check-scale.sh [BUILD_DIR]     (default: build)
# Writes 8 PEFT adapters into a temporary shared adapter directory (4 as
# NAME.safetensors, 4 as NAME/ directories), starts one reference server
# and the 3 replicas with HAProxy (deploy/haproxy/run.sh's functions, all
# with --auto-load), then, with tests/system/check_scale.py (the adapters,
# the load generator and the checks; stdlib only):
#   1. affinity: one request at a time, mixed adapters and base model: every
#      adapter is served and loaded, once, on exactly one replica (the
#      replicas' own /metrics counters say where). With one request in
#      flight the load bound never binds, so here no spill is allowed;
#   2. bounded load: 12 clients at once on one adapter and nothing else: it
#      is served beyond its home and loaded, once, on each replica it spilled
#      to, and no other adapter moves. That is how a spill is told apart from
#      a misroute: a spill only happens under concurrency, only for the
#      adapter that is hot, and only onto replicas that then serve it;
#   3. failover: mixed traffic from 4 clients, the home replica of the most
#      adapters gets SIGKILL mid-run: no client sees a failure (allowed: 0;
#      HAProxy's retries are counted from its log and stats and printed), its
#      adapters are served and loaded on the others;
#   4. return: that replica restarts on its port: once HAProxy has it up
#      again, one request at a time, every adapter is back on its home of 1,
#      and the returned replica loads its adapters again, once each;
#   5. requests/s through HAProxy vs one replica direct (printed, never
#      judged).
# Every answer of every phase is checked bitwise against the reference
# server's answer to the same request (the CPU backend is batch invariant).
# Bounded: a few thousand requests, about a minute on 2 cores; each phase
# has a time limit. Installs haproxy from Debian when missing
# (scripts/install-deps.sh). Exit status 0 only when every check passed.
# Sizes: LORASINK_SCALE_HIDDEN (1024), _INTERMEDIATE (512), _LAYERS (2);
# LORASINK_SCALE_KEEP=1 keeps the logs and HAProxy's configuration.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
BIN=$BUILD/lorasink
T0=$(date +%s)
[ -x "$BIN" ] || { echo "check-scale: $BIN not found: build first" >&2; exit 1; }
H=${LORASINK_SCALE_HIDDEN:-1024} F=${LORASINK_SCALE_INTERMEDIATE:-512} L=${LORASINK_SCALE_LAYERS:-2}

bash "$ROOT/scripts/install-deps.sh" haproxy

# shellcheck source=deploy/haproxy/run.sh
source "$ROOT/deploy/haproxy/run.sh"

TMP=$(mktemp -d)
REF_PID=""
cleanup() {
  local rc=$?
  set +e
  scale_stop
  if [ -n "$REF_PID" ]; then kill "$REF_PID" 2>/dev/null; wait "$REF_PID" 2>/dev/null; fi
  if [ $rc -ne 0 ]; then
    for log in "$TMP"/run/*.log "$TMP"/run/haproxy.err "$TMP"/ref.log; do
      [ -s "$log" ] && { echo "--- $log (tail)"; tail -8 "$log"; }
    done
    echo "check-scale: FAILED ($(($(date +%s) - T0)) s)"
  fi
  if [ "${LORASINK_SCALE_KEEP:-0}" = 1 ]; then echo "check-scale: kept $TMP"; else rm -rf "$TMP"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*" >&2; exit 1; }

ADIR=$TMP/adapters
mkdir -p "$ADIR"
DRIVE=$ROOT/tests/system/check_scale.py
# The adapters: 8 of them, 4 files and 4 PEFT directories.
python3 "$DRIVE" adapters --out "$ADIR" --hidden "$H" --intermediate "$F" --layers "$L"

SIZES=(--hidden "$H" --intermediate "$F" --layers "$L" --http-threads 2)

# The reference: one server alone, same model and adapters, asked each
# request on its own (adapters named in the body, not the header).
REF_PORT=$(scale_free_port)
"$BIN" --demo --threads 1 --access-log=false --log-level warn "${SIZES[@]}" --host 127.0.0.1 --port "$REF_PORT" \
  --adapter-dir "$ADIR" --auto-load >"$TMP/ref.log" 2>&1 &
REF_PID=$!
REF=http://127.0.0.1:$REF_PORT

scale_parse --build "$BUILD" --replicas 3 --adapter-dir "$ADIR" --port 0 --stats-port 0 --run-dir "$TMP/run" -- "${SIZES[@]}"
scale_wait_ready "$REF" 60
scale_start_all
LB=http://127.0.0.1:$SCALE_PORT
STATS=http://127.0.0.1:$SCALE_STATS_PORT
REPLICAS=$(for i in 1 2 3; do scale_replica_url "$i"; done | paste -sd,)
pass "3 replicas and HAProxy up ($LB), reference server up ($REF) ($(($(date +%s) - T0)) s)"


drive() {
  python3 "$DRIVE" "$1" --lb "$LB" --ref "$REF" --stats "$STATS" --replicas "$REPLICAS" \
    --hlog "$SCALE_RUN/haproxy.log" --state "$TMP/state.json" --hidden "$H" --layers "$L" "${@:2}"
}

drive sanity
drive affinity
VICTIM=$(drive victim)
drive hot
drive kill --pid "${SCALE_RPID[VICTIM - 1]}" --victim "$VICTIM"
while kill -0 "${SCALE_RPID[VICTIM - 1]}" 2>/dev/null; do sleep 0.1; done
scale_start_replica "$VICTIM"
scale_wait_ready "$(scale_replica_url "$VICTIM")" 60
t=$(date +%s%N)
scale_wait_up 3 30
ds=$((($(date +%s%N) - t + 50000000) / 100000000))
pass "return: r$VICTIM restarted on its port; HAProxy had it up again after $((ds / 10)).$((ds % 10)) s"
drive back --victim "$VICTIM"
drive rate
pass "check-scale ($(($(date +%s) - T0)) s)"
