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
if [ ! -f "$venv/stamp" ] || [ "$(cat "$venv/stamp")" != "$reqs" ]; then
  command -v python3 >/dev/null || { echo "check-openapi: python3 is missing" >&2; exit 1; }
  # Debian's python3 makes venvs only with python3-venv (ensurepip).
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt-get update -q >/dev/null && apt-get install -y -q python3-venv >/dev/null
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check $reqs
  echo "$reqs" >"$venv/stamp"
fi
py=$venv/bin/python

"$py" tests/system/check_openapi.py "$bin" || exit 1
echo "check-openapi: passed in $(($(date +%s) - start)) s"
