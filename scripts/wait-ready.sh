#!/usr/bin/env bash
# Waits until the server that process PID is starting (scripts/demo.sh,
# which installs and builds first) answers GET /ready, and prints that
# answer. It asks the address LOG says the server listens on (or
# $LORASINK_URL, which must then name the same port: it stops at once,
# saying so, when it does not), and only once LOG says so, so an older
# server on the port is never taken for it. It fails within a second of
# that process exiting (a port taken, a failed build, a bad flag),
# printing the end of LOG, and says every minute what LOG last said.
#   bash scripts/wait-ready.sh PID LOG [SECONDS, default 1800]
set -uo pipefail
pid=${1:?usage: wait-ready.sh PID LOG [SECONDS]} log=${2:?usage: wait-ready.sh PID LOG [SECONDS]}
limit=${3:-1800}
deadline=$((SECONDS + limit)) next_note=$((SECONDS + 60))

# port_of URL: its port, or the scheme's default.
port_of() {
  local hostport=${1#*://}
  hostport=${hostport%%/*}
  case $hostport in
  *:*) echo "${hostport##*:}" ;;
  *) case $1 in https:*) echo 443 ;; *) echo 80 ;; esac ;;
  esac
}

url=
while [ $SECONDS -lt $deadline ]; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "wait-ready: the server exited before it was ready; the end of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  if [ -z "$url" ]; then
    said=$(grep -m1 -oE '^listening on https?://[^ ]+' "$log" 2>/dev/null | cut -d' ' -f3)
    if [ -n "$said" ] && [ -n "${LORASINK_URL:-}" ] && [ "$(port_of "$said")" != "$(port_of "$LORASINK_URL")" ]; then
      echo "wait-ready: the server listens on $said but LORASINK_URL is $LORASINK_URL;" \
        "export LORASINK_URL=$said, or start the server on that URL's port (--port)" >&2
      exit 1
    fi
    [ -n "$said" ] && url=${LORASINK_URL:-$said}
  fi
  if [ -n "$url" ] && curl -sf "$url/ready"; then
    echo
    exit 0
  fi
  if [ $SECONDS -ge $next_note ]; then
    echo "wait-ready: still waiting after $((limit - deadline + SECONDS)) s; $log last said: $(tail -n 1 "$log" 2>/dev/null | cut -c1-160)" >&2
    next_note=$((SECONDS + 60))
  fi
  sleep 0.5
done
echo "wait-ready: no answer from ${url:-the server (its log never said where it listens)}/ready within $limit s; the end of $log:" >&2
tail -n 20 "$log" >&2
exit 1
