#!/usr/bin/env bash
# Installs what is missing, builds the server (only the server: no tests or
# benchmarks) and starts it on the built-in demo model at
# http://127.0.0.1:8080 (extra arguments go to the server). It serves in
# the foreground; GET /ready answers 200 once it listens.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
LORASINK_BUILD_TARGET=lorasink bash scripts/build.sh build
exec ./build/lorasink --demo "$@"
