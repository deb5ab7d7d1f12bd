#!/usr/bin/env bash
# Installs what is missing, builds, and starts lorasink on the built-in
# demo model at http://127.0.0.1:8080 (extra arguments go to the server).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh build
exec ./build/lorasink --demo "$@"
