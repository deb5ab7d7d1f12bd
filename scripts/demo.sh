#!/usr/bin/env bash
# Installs what is missing, builds the server (only the server: no tests or
# benchmarks) and starts it at http://127.0.0.1:8080 on the built-in demo
# model, or on --weights when the arguments give it (extra arguments go to
# the server). It serves in the foreground; GET /ready answers 200 once it
# listens.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
LORASINK_BUILD_TARGET=lorasink bash scripts/build.sh build
case " $* " in
*" --weights "* | *" --weights="*) exec ./build/lorasink "$@" ;;
*) exec ./build/lorasink --demo "$@" ;;
esac
