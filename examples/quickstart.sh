#!/usr/bin/env bash
# A tour of lorasink from curl, against a server started with the defaults
# (bash scripts/demo.sh, or ./build/lorasink --demo): H=1024, n=2, 2 layers.
# Loads two adapters three ways, runs a forward where every token picks its
# own adapter, reads the pool and deletes an adapter. It can run again:
# the uploads replace what an earlier run left. Every body is shown,
# error bodies too.
set -euo pipefail
URL=${LORASINK_URL:-http://127.0.0.1:8080}
AUTH=()
[ -n "${LORASINK_API_KEY:-}" ] && AUTH=(-H "Authorization: Bearer $LORASINK_API_KEY")
H=${H:-1024} N=${N:-2} F=${F:-512}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# call WANT CURL-ARGS...: one request; prints the body and stops unless
# the status is one of WANT ("200", or "200 201").
call() {
  local want=$1 status
  shift
  status=$(curl -sS -o "$tmp/body" -w '%{http_code}' "${AUTH[@]}" "$@") ||
    { echo "quickstart: no answer from $URL: is the server running (bash scripts/demo.sh)?"; exit 1; }
  if [[ " $want " != *" $status "* ]]; then
    cat "$tmp/body" >&2
    echo "quickstart: expected HTTP $want, got $status (the body above says why)" >&2
    exit 1
  fi
  cat "$tmp/body"
}

echo "== health and readiness"
call 200 "$URL/health"
call 200 "$URL/ready"

# A rank-4 PEFT adapter for layer 0 with small deterministic values, as
# JSON tensors and as a raw safetensors body, and a forward body.
python3 "$(dirname "$0")/quickstart_data.py" "$tmp" "$H" "$N" "$F"

echo "== load an adapter inline (JSON tensors; \"replace\": true lets this script run twice)"
call 201 "$URL/adapters" -H 'Content-Type: application/json' --data-binary @"$tmp/inline.json"

echo "== load the same factors as a raw safetensors body, alpha from __metadata__"
call 201 "$URL/adapters?name=raw-demo&replace=true" -H 'Content-Type: application/octet-stream' \
  --data-binary @"$tmp/adapter.safetensors"

echo "== validate a broken upload: the error names every problem and the fix"
call 422 "$URL/adapters/validate" -H 'Content-Type: application/json' \
  -d '{"format": "pool", "tensors": {"model.layers.0.mlp.shared_experts.gate_up_lora_a": [[[[1]]]]}}'

echo "== forward: token 0 uses inline-demo, token 1 the base model, token 2 raw-demo"
call 200 "$URL/forward" -H 'Content-Type: application/json' --data-binary @"$tmp/forward.json" >"$tmp/y.json"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print({"tokens": r["tokens"], "adapters": r["adapters"], "y[0][:4]": r["y"][0][:4]})' "$tmp/y.json"

echo "== the pool"
call 200 "$URL/pool" >"$tmp/pool.json"
python3 -c 'import json,sys; print("\n".join(json.dumps(json.load(open(sys.argv[1])), indent=2).splitlines()[:40]))' \
  "$tmp/pool.json"

echo "== delete one; naming it again is a 404, never a silent fall-back"
call 200 -X DELETE "$URL/adapters/raw-demo"
call 404 "$URL/forward" -d "{\"x\": [[$(python3 -c "print(','.join(['0.5']*$H))")]], \"adapter\": \"raw-demo\"}"

echo "== metrics (first lines)"
call 200 "$URL/metrics" >"$tmp/metrics.txt"
grep -m 10 -E '^lorasink_(requests_total|pool_)' "$tmp/metrics.txt"
