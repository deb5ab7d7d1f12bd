#!/usr/bin/env bash
# Checks docs/openapi.json against a running server built in $1 (default
# build; this script builds nothing): the document is valid OpenAPI 3.1,
# GET /openapi.json serves the same bytes, examples/make_adapters.py makes
# every adapter form and each loads (201) and serves a forward, and a
# bounded schemathesis run finds no 5xx and no response the document does
# not describe. Python tools live in .venv-ci/ (created on first use, pinned
# versions). Exits non-zero on any failure; prints the time it took.
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

tmp=$(mktemp -d)
pid=
stop_server() {
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  local rc=0
  wait "$pid" || rc=$?
  pid=
  return $rc
}
cleanup() { stop_server || true; rm -rf "$tmp"; }
trap cleanup EXIT

echo "== openapi-spec-validator"
"$venv/bin/openapi-spec-validator" docs/openapi.json

# --- the server ----------------------------------------------------------------
# Small sizes keep the run fast; the example is made for the same ones.
H=64 F=32 N=2 L=2
mkdir -p "$tmp/adapters"
"$bin" --demo --experts $N --hidden $H --intermediate $F --layers $L --slots 4 --max-rank 16 \
  --port 0 --adapter-dir "$tmp/adapters" --log-level warn >"$tmp/out" 2>"$tmp/err" &
pid=$!
url=
for _ in $(seq 100); do
  url=$(sed -n 's/^listening on \(http:[^ ]*\)$/\1/p' "$tmp/out")
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$url" ] || { echo "check-openapi: the server did not start" >&2; cat "$tmp/out" "$tmp/err" >&2; exit 1; }
echo "== server on $url"

echo "== GET /openapi.json is docs/openapi.json"
"$py" - "$url" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/openapi.json") as r:
    body, ctype = r.read(), r.headers.get("Content-Type", "")
if body != open("docs/openapi.json", "rb").read():
    sys.exit("GET /openapi.json differs from docs/openapi.json: rebuild the server")
if not ctype.startswith("application/json"):
    sys.exit("GET /openapi.json has Content-Type " + ctype)
print("same bytes,", len(body))
PY

echo "== examples/make_adapters.py: every form loads and serves"
"$py" examples/make_adapters.py --out "$tmp/adapters" --experts $N --hidden $H --intermediate $F --layers $L \
  --server "$url"

echo "== schemathesis"
# Run from the temp dir: schemathesis keeps its state in ./.schemathesis.
# Bounded in examples per operation and in time; the seed keeps a CI run
# reproducible (LORASINK_ST_SEED overrides it).
(cd "$tmp" && timeout 240 "$venv/bin/st" run "$root/docs/openapi.json" --url "$url" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance \
  --max-examples "${LORASINK_ST_EXAMPLES:-25}" --max-time "${LORASINK_ST_SECONDS:-90}" --workers 1 \
  --seed "${LORASINK_ST_SEED:-20261130}" --request-timeout 20 --generation-database none --no-color \
  >"$tmp/st.log" 2>&1) || {
  tail -150 "$tmp/st.log"
  echo "check-openapi: schemathesis found failures (above)" >&2
  exit 1
}
sed -n '/= SUMMARY =/,$p' "$tmp/st.log"

echo "== the server stops cleanly"
stop_server || { echo "check-openapi: the server exited non-zero" >&2; cat "$tmp/err" >&2; exit 1; }
echo "check-openapi: passed in $(($(date +%s) - start)) s"
