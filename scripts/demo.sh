#!/usr/bin/env bash
# Installs what building and running the server needs (not the test
# suite's tools), builds the server alone and serves it in the foreground
# on the built-in demo model, or on --weights when the arguments give it
# (extra arguments go to the server). The port is --port's, else
# LORASINK_URL's (http://127.0.0.1:PORT), else 8080; both given must
# agree, since wait-ready.sh and the examples read LORASINK_URL. A port
# already taken (an older demo, say) stops it at once, before the install
# and the build: nothing else may answer in its place. GET /ready answers
# 200 once it listens; scripts/wait-ready.sh waits for that.
set -euo pipefail
cd "$(dirname "$0")/.."
case " $* " in
*" --help "* | *" -h "*) # before anything is installed or built
  sed -n '2,10s/^# \{0,1\}//p' scripts/demo.sh
  if [ -x build/lorasink ]; then echo; ./build/lorasink --help; else echo "(the server's flags: build/lorasink --help, once built)"; fi
  exit 0
  ;;
esac
port=8080
given=false
if [[ "${LORASINK_URL:-}" =~ ^https?://[^/]*:([0-9]+)/?$ ]]; then port=${BASH_REMATCH[1]}; fi
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
  --port) port=${args[i + 1]:-$port} given=true ;;
  --port=*) port=${args[i]#--port=} given=true ;;
  esac
done
# wait-ready.sh and the examples find the server by LORASINK_URL: a
# --port that says otherwise would leave them asking another port.
if $given && [[ "${LORASINK_URL:-}" =~ ^https?://[^/]*:([0-9]+)/?$ ]] && [ "${BASH_REMATCH[1]}" != "$port" ]; then
  echo "demo.sh: --port $port and LORASINK_URL=$LORASINK_URL disagree; wait-ready.sh and the examples read" \
    "LORASINK_URL: give the port once (export LORASINK_URL=http://127.0.0.1:$port, without --port)" >&2
  exit 2
fi
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "demo.sh: 127.0.0.1:$port is already in use (an older demo? stop it, or pick another port:" \
    "export LORASINK_URL=http://127.0.0.1:$((port == 8081 ? 8082 : 8081)), without --port)" >&2
  exit 1
fi
bash scripts/install-deps.sh
# The server alone: a build dir the suite configured keeps its tests; a
# fresh one is configured without them (no cmocka or libcurl needed).
if [ -f build/CMakeCache.txt ]; then
  cmake --build build -j"$(nproc 2>/dev/null || echo 2)" --target lorasink
else
  LORASINK_BUILD_TARGET=lorasink bash scripts/build.sh build -DLORASINK_TESTS=OFF
fi
# The port goes to the server once: the caller's --port as given, else ours.
portarg=(--port "$port")
$given && portarg=()
case " $* " in
*" --weights "* | *" --weights="*) exec ./build/lorasink "${portarg[@]}" "$@" ;;
*) exec ./build/lorasink --demo "${portarg[@]}" "$@" ;;
esac
