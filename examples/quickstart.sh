#!/usr/bin/env bash
# A tour of lorasink from curl, against a server started with the defaults
# (bash scripts/demo.sh, or ./build/lorasink --demo): H=1024, n=2, 2 layers.
# Loads two adapters three ways, runs a forward where every token picks its
# own adapter, reads the pool and deletes an adapter.
set -euo pipefail
URL=${LORASINK_URL:-http://127.0.0.1:8080}
AUTH=()
[ -n "${LORASINK_API_KEY:-}" ] && AUTH=(-H "Authorization: Bearer $LORASINK_API_KEY")
H=${H:-1024} N=${N:-2} F=${F:-512}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== health and readiness"
curl -fsS "$URL/health"; echo
curl -fsS "$URL/ready"; echo

# A rank-4 PEFT adapter for layer 0 with small deterministic values.
python3 - "$tmp" "$H" "$N" "$F" <<'PY'
import json, struct, sys
out, H, n, F = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r = 4
def mat(rows, cols, k):
    return [[((i * 7 + j * 3 + k) % 13 - 6) / 256.0 for j in range(cols)] for i in range(rows)]
p = "model.layers.0.mlp.shared_experts."
tensors = {
    p + "gate_up_proj.lora_A.weight": mat(r, H, 1),
    p + "gate_up_proj.lora_B.weight": mat(n * 2 * F, r, 2),
    p + "down_proj.lora_A.weight": mat(r, n * F, 3),
    p + "down_proj.lora_B.weight": mat(H, r, 4),
}
json.dump({"name": "inline-demo", "config": {"r": r, "lora_alpha": 8}, "tensors": tensors},
          open(out + "/inline.json", "w"))
# the same factors as a raw safetensors body
header, blobs, off = {"__metadata__": {"lora_alpha": "16"}}, [], 0
for name, m in tensors.items():
    data = b"".join(struct.pack("<%df" % len(row), *row) for row in m)
    header[name] = {"dtype": "F32", "shape": [len(m), len(m[0])], "data_offsets": [off, off + len(data)]}
    blobs.append(data); off += len(data)
h = json.dumps(header).encode(); h += b" " * (-len(h) % 8)
open(out + "/adapter.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
x = [[((t * 5 + i) % 17 - 8) / 8.0 for i in range(H)] for t in range(3)]
json.dump({"x": x, "adapters": ["inline-demo", None, "raw-demo"]}, open(out + "/forward.json", "w"))
PY

echo "== load an adapter inline (JSON tensors)"
curl -fsS "${AUTH[@]}" "$URL/adapters" -H 'Content-Type: application/json' --data-binary @"$tmp/inline.json"; echo

echo "== load the same factors as a raw safetensors body, alpha from __metadata__"
curl -fsS "${AUTH[@]}" "$URL/adapters?name=raw-demo" -H 'Content-Type: application/octet-stream' \
  --data-binary @"$tmp/adapter.safetensors"; echo

echo "== validate a broken upload: the error names every problem and the fix"
curl -sS "${AUTH[@]}" "$URL/adapters/validate" -H 'Content-Type: application/json' \
  -d '{"format": "pool", "tensors": {"model.layers.0.mlp.shared_experts.gate_up_lora_a": [[[[1]]]]}}'; echo

echo "== forward: token 0 uses inline-demo, token 1 the base model, token 2 raw-demo"
curl -fsS "${AUTH[@]}" "$URL/forward" -H 'Content-Type: application/json' --data-binary @"$tmp/forward.json" |
  python3 -c 'import json,sys; r=json.load(sys.stdin); print({"tokens": r["tokens"], "adapters": r["adapters"], "y[0][:4]": r["y"][0][:4]})'

echo "== the pool"
curl -fsS "${AUTH[@]}" "$URL/pool" | python3 -m json.tool | head -40

echo "== delete one; naming it again is a 404, never a silent fall-back"
curl -fsS "${AUTH[@]}" -X DELETE "$URL/adapters/raw-demo"; echo
curl -sS "${AUTH[@]}" "$URL/forward" -d "{\"x\": [[$(python3 -c "print(','.join(['0.5']*$H))")]], \"adapter\": \"raw-demo\"}"; echo

echo "== metrics (first lines)"
curl -fsS "${AUTH[@]}" "$URL/metrics" | grep -E '^lorasink_(requests_total|pool_)' | head -10
