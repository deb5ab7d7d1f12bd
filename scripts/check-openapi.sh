#!/usr/bin/env bash
# Checks docs/openapi.json against a running server built in $1 (default
# build; this script builds nothing), with tests/system/check_openapi.py:
# the document is valid OpenAPI 3.1, GET /openapi.json serves the same
# bytes, examples/make_adapters.py makes every adapter form and each loads
# (201) and serves a forward, and a bounded schemathesis run finds no 5xx
# and no response the document does not describe. Python tools live in
# .venv-ci/ (created on first use, pinned versions). Exits non-zero on any
# failure; prints the time it took.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${1:-build}
bin=$build/lorasink
start=$(date +%s)
[ -x "$bin" ] || { echo "check-openapi: $bin not found: build first (bash scripts/build.sh $build)" >&2; exit 1; }

# --- tools -------------------------------------------------------------------
# Versions that run on Debian 12's Python 3.11; the stamp reinstalls when
# the list changes.
reqs="openapi-spec-validator==0.9.0 schemathesis==4.32.5 numpy==2.3.5 safetensors==0.8.0"
venv=$root/.venv-ci
# shellcheck source=scripts/venv.sh
. "$root/scripts/venv.sh"
ls_venv "$venv" "$reqs"
py=$venv/bin/python

"$py" tests/system/check_openapi.py "$bin" || exit 1
echo "check-openapi: passed in $(($(date +%s) - start)) s"
