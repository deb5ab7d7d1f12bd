#!/usr/bin/env bash
# Starts N lorasink replicas (default 3) that share one adapter directory
# and load adapters from it on first use (--auto-load), and HAProxy in front
# of them with deploy/haproxy/haproxy.cfg, all on loopback; prints the URLs
# and stops everything on Ctrl-C or SIGTERM. docs/scale.md describes it.
#
#   bash deploy/haproxy/run.sh --adapter-dir DIR [options] [-- LORASINK FLAGS...]
#
#   --adapter-dir DIR      the shared adapter directory (NAME/ PEFT dirs or
#                          NAME.safetensors files); required
#   --build DIR            where lorasink was built (default: build)
#   --replicas N           replicas (default 3)
#   --port P               HAProxy's port (default 8000; 0 picks a free one)
#   --stats-port P         HAProxy's stats page (default 8404; 0: free)
#   --replica-ports P,...  one port per replica (default: free ports)
#   --run-dir DIR          logs, pid files and the filled-in haproxy.cfg
#                          (default: a new temporary directory, kept)
#   -- FLAGS...            passed to every replica after the defaults
#                          (--threads 1 --access-log=false --log-level warn;
#                          the demo model unless --weights FILE), so they
#                          override them, e.g.
#                          -- --hidden 4096 --intermediate 2048 --slots 16
#                          (--host, --port, --adapter-dir and --auto-load
#                          are run.sh's)
#
# scripts/check-scale.sh sources this file (nothing runs when sourced) to
# use the same functions, so it can kill and restart one replica.
set -euo pipefail

SCALE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SCALE_TEMPLATE=$SCALE_ROOT/deploy/haproxy/haproxy.cfg
SCALE_HOST=127.0.0.1
SCALE_RPID=()
SCALE_RPORT=()
SCALE_HAPROXY_PID=""

scale_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

scale_usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
}

# scale_parse ARGS...: sets the SCALE_* settings from run.sh's options.
scale_parse() {
  SCALE_BUILD=$SCALE_ROOT/build SCALE_N=3 SCALE_PORT=8000 SCALE_STATS_PORT=8404
  SCALE_ADIR="" SCALE_RUN="" SCALE_EXTRA=() SCALE_RPORT=()
  local ports=""
  while [ $# -gt 0 ]; do
    case $1 in
      --adapter-dir) SCALE_ADIR=$2; shift 2 ;;
      --build) SCALE_BUILD=$2; shift 2 ;;
      --replicas) SCALE_N=$2; shift 2 ;;
      --port) SCALE_PORT=$2; shift 2 ;;
      --stats-port) SCALE_STATS_PORT=$2; shift 2 ;;
      --replica-ports) ports=$2; shift 2 ;;
      --run-dir) SCALE_RUN=$2; shift 2 ;;
      --) shift; SCALE_EXTRA=("$@"); break ;;
      -h|--help) scale_usage; exit 0 ;;
      *) echo "run.sh: unknown option $1 (--help lists them)" >&2; return 2 ;;
    esac
  done
  case "$SCALE_BUILD" in /*) ;; *) SCALE_BUILD=$PWD/$SCALE_BUILD ;; esac
  SCALE_BIN=$SCALE_BUILD/lorasink
  [ -x "$SCALE_BIN" ] || { echo "run.sh: $SCALE_BIN not found: build first (bash scripts/build.sh)" >&2; return 1; }
  # Fail here rather than with three replicas exiting on an unknown flag.
  local help
  help=$("$SCALE_BIN" --help)
  [[ "$help" == *--auto-load* ]] ||
    { echo "run.sh: $SCALE_BIN has no --auto-load: rebuild it from a newer tree" >&2; return 1; }
  command -v haproxy >/dev/null ||
    { echo "run.sh: haproxy not found: apt-get install haproxy (Debian 12 has 2.6)" >&2; return 1; }
  if [ -z "$SCALE_ADIR" ] || [ ! -d "$SCALE_ADIR" ]; then
    echo "run.sh: --adapter-dir DIR is required and must be a directory" >&2
    return 1
  fi
  SCALE_ADIR=$(cd "$SCALE_ADIR" && pwd)
  [[ "$SCALE_N" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --replicas must be a positive number" >&2; return 1; }
  [ "$SCALE_PORT" = 0 ] && SCALE_PORT=$(scale_free_port)
  [ "$SCALE_STATS_PORT" = 0 ] && SCALE_STATS_PORT=$(scale_free_port)
  if [ -n "$ports" ]; then
    IFS=, read -r -a SCALE_RPORT <<<"$ports"
    [ ${#SCALE_RPORT[@]} = "$SCALE_N" ] || { echo "run.sh: --replica-ports needs $SCALE_N ports" >&2; return 1; }
  else
    local i
    for ((i = 1; i <= SCALE_N; i++)); do SCALE_RPORT[i - 1]=$(scale_free_port); done
  fi
  [ -n "$SCALE_RUN" ] || SCALE_RUN=$(mktemp -d "${TMPDIR:-/tmp}/lorasink-scale.XXXXXX")
  mkdir -p "$SCALE_RUN"
}

# scale_replica_url I: the URL of replica I (1-based).
scale_replica_url() { echo "http://$SCALE_HOST:${SCALE_RPORT[$1 - 1]}"; }

# scale_wait_ready URL SECONDS: until GET URL/ready answers 200.
scale_wait_ready() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    curl -sf -o /dev/null "$1/ready" && return 0
    sleep 0.1
  done
  echo "run.sh: $1 not ready after $2 s" >&2
  return 1
}

# scale_start_replica I: starts replica I on its port (a restart reuses the
# port, which is what HAProxy's server line names). The log is appended,
# so a restart keeps the first run's lines.
scale_start_replica() {
  local i=$1
  "$SCALE_BIN" --threads 1 --access-log=false --log-level warn "${SCALE_EXTRA[@]}" \
    --host "$SCALE_HOST" --port "${SCALE_RPORT[i - 1]}" --adapter-dir "$SCALE_ADIR" --auto-load \
    >>"$SCALE_RUN/replica-$i.log" 2>&1 &
  SCALE_RPID[i - 1]=$!
  # Out of the job table: a replica killed on purpose (check-scale.sh does)
  # would otherwise get a "Killed" line from bash; scale_stop polls instead
  # of waiting, and bash still reaps it.
  disown "${SCALE_RPID[i - 1]}"
  echo "${SCALE_RPID[i - 1]}" >"$SCALE_RUN/replica-$i.pid"
}

# scale_write_cfg: the template with one server line per replica in each
# backend (the r1 line repeated), into the run directory. The copy drops
# the addresses' defaults: an address this script did not set is an error.
scale_write_cfg() {
  awk -v n="$SCALE_N" '
    /^[ \t]*server r1 / {
      sub(/_1-[^}]*}/, "_1}")
      for (i = 1; i <= n; i++) { l = $0; gsub(/r1/, "r" i, l); gsub(/REPLICA_1/, "REPLICA_" i, l); print l }
      next
    }
    /^[ \t]*server r[0-9]+ / { next }
    { print }' "$SCALE_TEMPLATE" >"$SCALE_RUN/haproxy.cfg"
}

scale_haproxy_env() {
  local i
  export LORASINK_LB_BIND=$SCALE_HOST:$SCALE_PORT LORASINK_LB_STATS_BIND=$SCALE_HOST:$SCALE_STATS_PORT
  for ((i = 1; i <= SCALE_N; i++)); do export "LORASINK_REPLICA_$i=$SCALE_HOST:${SCALE_RPORT[i - 1]}"; done
}

# scale_start_haproxy: checks the filled-in configuration, then runs HAProxy
# in the foreground of a background job (-db), so its PID is ours to stop.
# Request log lines go to haproxy.log, its own messages to haproxy.err.
scale_start_haproxy() {
  scale_write_cfg
  scale_haproxy_env
  haproxy -c -q -f "$SCALE_RUN/haproxy.cfg" || { echo "run.sh: haproxy -c rejected $SCALE_RUN/haproxy.cfg" >&2; return 1; }
  haproxy -db -f "$SCALE_RUN/haproxy.cfg" >>"$SCALE_RUN/haproxy.log" 2>>"$SCALE_RUN/haproxy.err" &
  SCALE_HAPROXY_PID=$!
  echo "$SCALE_HAPROXY_PID" >"$SCALE_RUN/haproxy.pid"
}

# scale_start_all: every replica, each ready, then HAProxy, and until every
# replica is up in HAProxy's view (its first health checks).
scale_start_all() {
  local i
  for ((i = 1; i <= SCALE_N; i++)); do scale_start_replica "$i"; done
  for ((i = 1; i <= SCALE_N; i++)); do
    scale_wait_ready "$(scale_replica_url "$i")" 60 || { tail -5 "$SCALE_RUN/replica-$i.log" >&2; return 1; }
  done
  scale_start_haproxy
  scale_wait_up "$SCALE_N" 30
}

# scale_up_count: replicas HAProxy has UP in the adapters backend.
scale_up_count() {
  curl -sf "http://$SCALE_HOST:$SCALE_STATS_PORT/stats;csv" 2>/dev/null |
    awk -F, '$1 == "adapters" && $2 ~ /^r[0-9]+$/ && $18 == "UP" { n++ } END { print n + 0 }'
}

# scale_wait_up N SECONDS: until N replicas are UP in HAProxy's view.
scale_wait_up() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    [ "$(scale_up_count)" = "$1" ] && return 0
    sleep 0.1
  done
  echo "run.sh: HAProxy has $(scale_up_count) replicas up, not $1, after $2 s" >&2
  return 1
}

# scale_stop: SIGTERM to every process started here (replicas finish their
# requests in flight), then SIGKILL to any still there after 10 s.
scale_stop() {
  local pids=() pid i
  [ -n "$SCALE_HAPROXY_PID" ] && pids+=("$SCALE_HAPROXY_PID")
  for pid in "${SCALE_RPID[@]}"; do [ -n "$pid" ] && pids+=("$pid"); done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    kill -0 "${pids[@]}" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
  [ -n "$SCALE_HAPROXY_PID" ] && { wait "$SCALE_HAPROXY_PID" 2>/dev/null || true; }
  SCALE_HAPROXY_PID="" SCALE_RPID=()
}

scale_main() {
  scale_parse "$@"
  trap 'scale_stop' EXIT
  trap 'exit 0' INT TERM
  scale_start_all
  local i
  echo "lorasink behind HAProxy:   http://$SCALE_HOST:$SCALE_PORT  (POST /forward with X-Lorasink-Adapter: NAME)"
  echo "HAProxy stats:             http://$SCALE_HOST:$SCALE_STATS_PORT/stats  (/stats;csv, /metrics)"
  for ((i = 1; i <= SCALE_N; i++)); do
    echo "replica r$i:                $(scale_replica_url "$i")  (pid ${SCALE_RPID[i - 1]}, log $SCALE_RUN/replica-$i.log)"
  done
  echo "adapters from $SCALE_ADIR; logs and haproxy.cfg in $SCALE_RUN; Ctrl-C stops everything"
  # A replica that dies stays down (HAProxy routes around it); HAProxy
  # exiting ends the whole set.
  wait "$SCALE_HAPROXY_PID" || true
  echo "run.sh: HAProxy exited; stopping the replicas (see $SCALE_RUN/haproxy.err)" >&2
  exit 1
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  scale_main "$@"
fi
