#!/usr/bin/env bash
# HTTP benchmark (issue 6): requests/s and p50/p99 latency of T=1 /forward
# requests on the demo model at concurrency 1, 8 and 64, with batching on
# and off (wrk, Debian package); prints tokens/s on / off and /forward T=1
# requests/s as a fraction of /health requests/s. One summary line per
# ratio; never passes or fails on time.
#   bench/bench_http.sh [build dir] [seconds per run]
# LS_BENCH_SHAPE="H F L" serves another demo shape (default "1024 512 2",
# whose weights sit in the L3 cache; "4096 2048 1" is one layer of an
# Inkling-Small-like model, whose weights do not). LS_BENCH_BODY=base64
# sends x as a base64 f32 tensor and asks for y the same way (default
# json: nested arrays of numbers both ways).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SECS=${2:-5}
BIN=$BUILD/lorasink
command -v wrk >/dev/null || { echo "bench_http: skipped: wrk is not installed (apt-get install wrk)"; exit 0; }
[ -x "$BIN" ] || { echo "bench_http: build first (bash scripts/build.sh)"; exit 1; }
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
read -r H F L <<<"${LS_BENCH_SHAPE:-1024 512 2}"
BODY=${LS_BENCH_BODY:-json}
case $BODY in json | base64) ;; *) echo "bench_http: LS_BENCH_BODY is json or base64"; exit 2 ;; esac
python3 - "$tmp" "$H" "$BODY" <<'PY'
import base64, json, struct, sys
out, H, form = sys.argv[1], int(sys.argv[2]), sys.argv[3]
x = [((i * 7) % 13 - 6) / 8.0 for i in range(H)]
if form == "json":
    body = json.dumps({"x": [x]})
else:
    data = base64.b64encode(struct.pack("<%df" % H, *x)).decode()
    body = json.dumps({"x": {"dtype": "f32", "shape": [1, H], "data": data}, "encoding": "base64"})
open(out + "/forward.lua", "w").write(
    'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = %s\n' % json.dumps(body))
PY

start() { # args: extra server flags
  "$BIN" --demo --port 0 --http-threads 4 --hidden "$H" --intermediate "$F" --layers "$L" --access-log=false "$@" \
    >"$tmp/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$tmp/server.log" | grep -o '[0-9]*$' || true)
    [ -n "$port" ] && return 0
    sleep 0.05
  done
  echo "server did not start"; cat "$tmp/server.log"; exit 1
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }

# wrk → "rps p50_ms p99_ms"
run_wrk() { # conns path [script]
  local c=$1 path=$2 script=${3:-}
  local t=$(( c < 2 ? 1 : 2 ))
  local out
  out=$(wrk -t"$t" -c"$c" -d"${SECS}s" --latency ${script:+-s "$script"} "http://127.0.0.1:$port$path" 2>&1)
  local rps p50 p99
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  echo "$rps $(to_ms "$p50") $(to_ms "$p99")"
}
to_ms() { # wrk prints 812.00us, 1.23ms, 2.01s
  local v=$1
  case $v in
    *us) awk -v x="${v%us}" 'BEGIN{printf "%.3f", x/1000}' ;;
    *ms) awk -v x="${v%ms}" 'BEGIN{printf "%.3f", x}' ;;
    *s) awk -v x="${v%s}" 'BEGIN{printf "%.3f", x*1000}' ;;
    *) echo "nan" ;;
  esac
}

start --batching=true
isa=$(curl -s "http://127.0.0.1:$port/ready" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("isa", "?"))')
stop
echo "# lorasink HTTP benchmark: demo model (n=2, H=$H, F=$F, L=$L), T=1 forwards, $BODY bodies, ${SECS}s per run, $(nproc) cores, $isa kernels"
echo "| batching | concurrency | requests/s | p50 ms | p99 ms |"
echo "|---|---|---|---|---|"
declare -A RPS
for mode in on off; do
  if [ $mode = on ]; then start --batching=true --batch-wait-us 200; else start --batching=false; fi
  for c in 1 8 64; do
    read -r rps p50 p99 < <(run_wrk "$c" /forward "$tmp/forward.lua")
    RPS[$mode,$c]=$rps
    echo "| $mode | $c | $rps | $p50 | $p99 |"
  done
  if [ $mode = on ]; then read -r HEALTH _ _ < <(run_wrk 8 /health); fi
  stop
done
echo "| /health | 8 | $HEALTH | | |"
for c in 1 8 64; do
  awk -v a="${RPS[on,$c]}" -v b="${RPS[off,$c]}" -v c="$c" \
    'BEGIN{printf "http: concurrency %d tokens/s batching on / off = %.2f\n", c, a/b}'
done
awk -v a="${RPS[on,8]}" -v b="$HEALTH" 'BEGIN{printf "http: /forward T=1 requests/s / /health requests/s (concurrency 8) = %.3f\n", a/b}'
# Batched, a base token costs its FLOPs (6 n H F a layer); unbatched, a
# stream of the weights. So at 64 connections on / off is at most the
# engine threads' FMA peak / FLOPs per token / unbatched requests/s, even
# with HTTP free: the ratio a machine can reach.
PEAK_BIN=$BUILD/bench/bench_cpu
if [ -x "$PEAK_BIN" ] && peak=$("$PEAK_BIN" --fma-peak --threads "$(nproc)" --isa "$isa" 2>/dev/null); then
  awk -v p="$peak" -v n=2 -v h="$H" -v f="$F" -v l="$L" -v on="${RPS[on,64]}" -v off="${RPS[off,64]}" 'BEGIN{
    cap = p * 1e9 / (6.0 * n * h * f * l)
    printf "http: ceiling of on / off at concurrency 64 = FMA peak %.1f GFLOP/s / %.1f MFLOP a token / %.1f requests/s unbatched = %.2f (reached %.2f of it)\n", p, 6.0 * n * h * f * l / 1e6, off, cap / off, (on / off) / (cap / off)
  }'
else
  echo "http: ceiling of on / off: skipped ($PEAK_BIN not built)"
fi
