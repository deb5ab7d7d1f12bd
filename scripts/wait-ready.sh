#!/usr/bin/env bash
# Waits until the server that process PID is starting (scripts/demo.sh,
# which installs and builds first) answers GET /ready at $LORASINK_URL
# (default http://127.0.0.1:8080), and prints that answer. It fails within
# a second of that process exiting (a port taken, a failed build, a bad
# flag), printing the end of LOG, and only asks /ready once LOG says the
# server listens, so an older server on the port is never taken for it.
#   bash scripts/wait-ready.sh PID LOG [SECONDS, default 1800]
set -uo pipefail
pid=${1:?usage: wait-ready.sh PID LOG [SECONDS]} log=${2:?usage: wait-ready.sh PID LOG [SECONDS]}
url=${LORASINK_URL:-http://127.0.0.1:8080}
deadline=$((SECONDS + ${3:-1800}))
while [ $SECONDS -lt $deadline ]; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "wait-ready: the server exited before it was ready; the end of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  if grep -q '^listening on http' "$log" 2>/dev/null && curl -sf "$url/ready"; then
    echo
    exit 0
  fi
  sleep 0.5
done
echo "wait-ready: no answer from $url/ready within ${3:-1800} s; the end of $log:" >&2
tail -n 20 "$log" >&2
exit 1
