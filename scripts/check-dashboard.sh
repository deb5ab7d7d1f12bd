#!/usr/bin/env bash
# The dashboard and the metrics end to end, against a running server:
#   bash scripts/check-dashboard.sh [BUILD_DIR]     (default: build)
# Starts BUILD_DIR/lorasink (demo model, small sizes, 3 slots, a host tier
# of 2, an API key), loads adapters so that some are resident (one pinned),
# one is in the host tier only and some are on disk only, keeps forward
# traffic running, then checks:
#   1. auth: /dashboard is served without the key, the data routes are not;
#   2. promtool check metrics on a scrape;
#   3. a real Prometheus (loopback, temporary storage, bearer auth, 1 s
#      scrapes) holds one series of each kind (counter, gauge, histogram,
#      build_info, process_*, per-adapter, lora_requests_info);
#   4. headless Chromium (scripts/check_dashboard_page.py, over the
#      DevTools protocol on a pipe, scripts/cdp_pipe.py): the
#      page asks for the key once (the form), keeps it in sessionStorage
#      only (never the URL), and after a reload renders without asking;
#      the rendered DOM has every resident adapter in its slot, every
#      registered adapter in the registry and data in every plot. The
#      screenshot goes to BUILD_DIR/artifacts/dashboard.png and a copy
#      scaled down to at most 150 KiB beside it (to docs/dashboard.png, the
#      README's picture, with LORASINK_UPDATE_DOCS=1);
#   5. pages of another origin against a server without a key, in headless
#      Chromium (scripts/check_cross_site.py): a no-cors text/plain upload
#      that would replace and pin an adapter, and a DNS-rebinding read;
#      both refused (403), nothing changed or read.
# Installs chromium and prometheus from Debian when missing
# (scripts/install-deps.sh). Exit status 0 only when every check passed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
BIN=$BUILD/lorasink
T0=$(date +%s)
[ -x "$BIN" ] || { echo "check-dashboard: $BIN not found: build first" >&2; exit 1; }

bash "$ROOT/scripts/install-deps.sh" chromium prometheus

TMP=$(mktemp -d)
PIDS=()
cleanup() {
  local rc=$?
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ $rc -ne 0 ]; then
    for log in "$TMP"/*.log; do [ -s "$log" ] && { echo "--- $log (tail)"; tail -20 "$log"; }; done
    echo "check-dashboard: FAILED ($(($(date +%s) - T0)) s)"
  fi
  rm -rf "$TMP"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

KEY="dash-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
ADIR=$TMP/adapters
mkdir -p "$ADIR" "$BUILD/artifacts"

# Rank-4 PEFT adapters for layer 0 of the model below (n=2, H=64, F=32),
# each with its own values.
python3 - "$ADIR" <<'PY'
import json, struct, sys
out, H, n, F, r = sys.argv[1], 64, 2, 32, 4
p = "model.layers.0.mlp.shared_experts."
for k, name in enumerate(["pinned-a", "path-b", "path-c", "inline-d", "inline-e", "inline-f"]):
    def mat(rows, cols, s):
        return [((i * 7 + j * 3 + s + 5 * k) % 13 - 6) / 256.0 for i in range(rows) for j in range(cols)]
    tensors = {p + "gate_up_proj.lora_A.weight": (r, H), p + "gate_up_proj.lora_B.weight": (n * 2 * F, r),
               p + "down_proj.lora_A.weight": (r, n * F), p + "down_proj.lora_B.weight": (H, r)}
    header, blobs, off = {"__metadata__": {"lora_alpha": "8"}}, [], 0
    for s, (tname, shape) in enumerate(tensors.items()):
        vals = mat(shape[0], shape[1], s)
        data = struct.pack("<%df" % len(vals), *vals)
        header[tname] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open("%s/%s.safetensors" % (out, name), "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY

"$BIN" --demo --hidden 64 --intermediate 32 --slots 3 --host-cache 2 --adapter-dir "$ADIR" --port 0 \
  --api-key "$KEY" --threads 1 --http-threads 4 --log-level warn >"$TMP/server.log" 2>&1 &
PIDS+=($!)
URL=""
for _ in $(seq 100); do
  URL=$(sed -n 's/^listening on \(http:[^ ]*\).*/\1/p' "$TMP/server.log")
  [ -n "$URL" ] && break
  sleep 0.1
done
[ -n "$URL" ] || fail "the server did not start"
AUTH=(-H "Authorization: Bearer $KEY")

# 1. Auth: the page holds no data and is open; everything it reads is not.
code=$(curl -s -o "$TMP/page.html" -w '%{http_code} %{content_type}' "$URL/dashboard")
[ "$code" = "200 text/html; charset=utf-8" ] || fail "GET /dashboard without the key: $code"
grep -q 'id="slots"' "$TMP/page.html" || fail "/dashboard is not the dashboard page"
! grep -Eq '(src|href)="(https?:)?//' "$TMP/page.html" || fail "/dashboard refers to an external resource"
for path in /pool /adapters /metrics; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "$URL$path")
  [ "$code" = 401 ] || fail "GET $path without the key: $code, expected 401"
done
pass "auth: /dashboard open, /pool /adapters /metrics answer 401 without the key"

# Adapters: pinned-a, path-b and path-c from paths, then three inline
# uploads. Three slots and a host tier of two end with pinned-a and two
# inline ones resident, one inline one evicted but in the host tier, and
# path-b and path-c evicted with their host copies dropped (disk).
load_path() {
  curl -fsS "${AUTH[@]}" "$URL/adapters" -d "{\"name\": \"$1\", \"path\": \"$1.safetensors\"$2}" >/dev/null
}
load_inline() {
  curl -fsS "${AUTH[@]}" "$URL/adapters?name=$1" -H 'Content-Type: application/octet-stream' \
    --data-binary @"$ADIR/$1.safetensors" >/dev/null
}
load_path pinned-a ', "pinned": true'
load_path path-b ""
load_path path-c ""
load_inline inline-d
load_inline inline-e
load_inline inline-f
curl -fsS "${AUTH[@]}" "$URL/adapters" >"$TMP/adapters.json"
python3 - "$TMP/adapters.json" <<'PY' || fail "adapter states"
import json, sys
ads = {a["name"]: a for a in json.load(open(sys.argv[1]))["adapters"]}
states = {n: a["state"] for n, a in ads.items()}
print("adapters:", states)
assert any(a["state"] == "resident" and a["pinned"] for a in ads.values()), "no pinned resident adapter"
assert sum(s == "resident" for s in states.values()) >= 2, "fewer than two resident adapters"
assert "host" in states.values(), "no adapter in the host tier only"
assert "disk" in states.values(), "no adapter on disk only"
PY
RESIDENT=$(python3 -c 'import json,sys; print(" ".join(a["name"] for a in json.load(open(sys.argv[1]))["adapters"] if a["state"] == "resident"))' "$TMP/adapters.json")
pass "adapters in every state: resident (one pinned), host, disk"

# Traffic until the end: forwards over the resident adapters and the base
# model (hits only, so the slots hold still while the page is checked),
# and a few that name an unknown adapter (404s, for the 4xx plot).
python3 - "$URL" "$KEY" $RESIDENT >"$TMP/traffic.log" 2>&1 <<'PY' &
import json, sys, threading, time, urllib.error, urllib.request
url, key, names = sys.argv[1], sys.argv[2], sys.argv[3:]
x = [[((t * 5 + i) % 17 - 8) / 64.0 for i in range(64)] for t in range(4)]
def post(body):
    req = urllib.request.Request(url + "/forward", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=10).read()
    except urllib.error.HTTPError as e:
        e.read()
def worker(k):
    i = 0
    while True:
        i += 1
        if i % 10 == 0:
            post({"x": x, "adapter": "no-such-adapter"})
        else:
            post({"x": x, "adapters": [names[(i + k) % len(names)], None, names[(i + k + 1) % len(names)], None]})
        time.sleep(0.02)
for k in range(3):
    threading.Thread(target=worker, args=(k,), daemon=True).start()
while True:
    time.sleep(1)
PY
PIDS+=($!)
sleep 1

# 2. promtool on a scrape.
curl -fsS "${AUTH[@]}" "$URL/metrics" >"$TMP/metrics.txt"
promtool check metrics <"$TMP/metrics.txt" >"$TMP/promtool.log" 2>&1 || { cat "$TMP/promtool.log"; fail "promtool check metrics"; }
pass "promtool check metrics: clean ($(grep -vc '^#' "$TMP/metrics.txt") samples)"

# 3. A real Prometheus scraping the server every second.
PPORT=$(free_port)
HOSTPORT=${URL#http://}
printf '%s' "$KEY" >"$TMP/key"
cat >"$TMP/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: lorasink
    authorization:
      type: Bearer
      credentials_file: $TMP/key
    static_configs:
      - targets: ['$HOSTPORT']
EOF
prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="127.0.0.1:$PPORT" --log.level=warn >"$TMP/prometheus.log" 2>&1 &
PIDS+=($!)
python3 - "http://127.0.0.1:$PPORT" <<'PY' || fail "Prometheus queries"
import json, sys, time, urllib.parse, urllib.request
base = sys.argv[1]
def query(q):
    try:
        with urllib.request.urlopen(base + "/api/v1/query?" + urllib.parse.urlencode({"query": q}), timeout=5) as r:
            body = json.load(r)
    except OSError:
        return None
    return body["data"]["result"] if body.get("status") == "success" else None
deadline = time.time() + 60
while True:  # three scrapes that found the target up
    res = query('sum_over_time(up{job="lorasink"}[1m])')
    if res and float(res[0]["value"][1]) >= 3:
        break
    if time.time() > deadline:
        sys.exit("Prometheus did not scrape the server three times: %r" % (res,))
    time.sleep(0.5)
kinds = {
    "counter": 'rate(lorasink_requests_total{route="/forward",status="200"}[10s]) > 0',
    "gauge": "lorasink_pool_slots == 3",
    "histogram": 'histogram_quantile(0.99, sum by (le) (rate(lorasink_request_duration_seconds_bucket{route="/forward"}[10s]))) > 0',
    "build_info": 'lorasink_build_info{backend!="",version!=""} == 1',
    "process": "process_resident_memory_bytes > 0 and process_open_fds > 0",
    "per-adapter": 'lorasink_adapter_requests_total{adapter="pinned-a"} > 0',
    "lora_requests_info": 'lorasink_lora_requests_info{max_lora="3"} == 1',
}
bad = []
for kind, q in kinds.items():
    res = query(q)
    print("  %-18s %-3s %s" % (kind, "ok" if res else "--", q))
    if not res:
        bad.append(kind)
if bad:
    sys.exit("no result for: " + ", ".join(bad))
PY
pass "prometheus: scraped with the key; a series of each kind answers a query"

# 4. The page in headless Chromium, over the DevTools protocol on a pipe
# (no port, no websocket library).
small=$BUILD/artifacts/dashboard-small.png
[ "${LORASINK_UPDATE_DOCS:-0}" = 1 ] && small=$ROOT/docs/dashboard.png
python3 "$ROOT/scripts/check_dashboard_page.py" "$URL" "$KEY" "$BUILD/artifacts/dashboard.png" "$small" "$TMP" ||
  fail "browser checks"

# 5. Cross-site requests and DNS rebinding, from pages of other origins.
python3 "$ROOT/scripts/check_cross_site.py" "$BIN" "$TMP" || fail "cross-site checks"

echo "check-dashboard: all passed in $(($(date +%s) - T0)) s"
