#!/usr/bin/env bash
# The dashboard and the metrics end to end, against a running server:
#   bash scripts/check-dashboard.sh [BUILD_DIR]     (default: build)
# Installs chromium and prometheus from Debian when missing
# (scripts/install-deps.sh), then runs tests/system/check_dashboard.py
# (its docstring lists the checks: auth, promtool, a real Prometheus, the
# page in headless Chromium, cross-site pages). The screenshot goes to
# BUILD_DIR/artifacts/dashboard.png and a copy scaled down to at most
# 150 KiB beside it (to docs/dashboard.png, the README's picture, with
# LORASINK_UPDATE_DOCS=1). Exit status 0 only when every check passed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
BIN=$BUILD/lorasink
T0=$(date +%s)
[ -x "$BIN" ] || { echo "check-dashboard: $BIN not found: build first" >&2; exit 1; }

bash "$ROOT/scripts/install-deps.sh" chromium prometheus

mkdir -p "$BUILD/artifacts"
small=$BUILD/artifacts/dashboard-small.png
[ "${LORASINK_UPDATE_DOCS:-0}" = 1 ] && small=$ROOT/docs/dashboard.png
if ! python3 "$ROOT/tests/system/check_dashboard.py" "$BIN" "$BUILD/artifacts/dashboard.png" "$small"; then
  echo "check-dashboard: FAILED ($(($(date +%s) - T0)) s)"
  exit 1
fi
echo "check-dashboard: all passed in $(($(date +%s) - T0)) s"
