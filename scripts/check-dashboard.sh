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
#   4. headless Chromium, driven over the DevTools protocol on a pipe: the
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
python3 - "$URL" "$KEY" "$BUILD/artifacts/dashboard.png" "$small" "$TMP" <<'PY' || fail "browser checks"
import base64, html.parser, json, os, subprocess, sys, time, urllib.request
url, key, shot, small, tmp = sys.argv[1:6]

# Chromium reads commands from fd 3 and writes replies to fd 4, each a JSON
# text ended by a NUL byte.
cmd_r, cmd_w = os.pipe()
res_r, res_w = os.pipe()
def child_fds():
    a, b = os.dup(cmd_r), os.dup(res_w)
    os.dup2(a, 3)
    os.dup2(b, 4)
    for fd in (cmd_r, cmd_w, res_r, res_w, a, b):
        if fd > 4:
            os.close(fd)
browser = subprocess.Popen(
    ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
     "--remote-debugging-pipe", "--user-data-dir=" + tmp + "/chromium", "--window-size=1280,1100",
     "--hide-scrollbars", "about:blank"],
    preexec_fn=child_fds, close_fds=False, stdout=open(tmp + "/chromium.log", "w"), stderr=subprocess.STDOUT)
os.close(cmd_r)
os.close(res_w)
pending, next_id = b"", 0

def call(method, session=None, **params):
    global pending, next_id
    next_id += 1
    msg = {"id": next_id, "method": method, "params": params}
    if session:
        msg["sessionId"] = session
    os.write(cmd_w, json.dumps(msg).encode() + b"\0")
    deadline = time.time() + 30
    while True:
        while b"\0" in pending:
            raw, pending = pending.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == next_id:
                if "error" in reply:
                    raise RuntimeError("%s: %s" % (method, reply["error"]))
                return reply["result"]
        if time.time() > deadline:
            raise RuntimeError(method + ": no reply")
        chunk = os.read(res_r, 1 << 16)
        if not chunk:
            raise RuntimeError("chromium closed the pipe")
        pending += chunk

def js(session, expr):
    r = call("Runtime.evaluate", session, expression=expr, returnByValue=True, awaitPromise=True)
    if "exceptionDetails" in r:
        raise RuntimeError("%s: %s" % (expr, r["exceptionDetails"]))
    return r["result"].get("value")

def wait_for(session, expr, what, timeout=30):
    # Until the page has loaded its elements are not there: not yet, not
    # an error.
    guarded = "(() => { try { return !!(%s); } catch (e) { return false; } })()" % expr
    deadline = time.time() + timeout
    while time.time() < deadline:
        if js(session, guarded):
            return
        time.sleep(0.2)
    raise SystemExit("timed out waiting for " + what)

def get(path):
    req = urllib.request.Request(url + path, headers={"Authorization": "Bearer " + key})
    return json.load(urllib.request.urlopen(req, timeout=5))

try:
    target = call("Target.createTarget", url="about:blank")["targetId"]
    s = call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    call("Page.enable", s)
    call("Page.navigate", s, url=url + "/dashboard")

    # The first fetch gets 401: the page asks for the key.
    wait_for(s, "document.getElementById('auth').dataset.auth === 'needed'", "the API key form")
    js(s, "document.getElementById('auth-key').focus()")
    call("Input.insertText", s, text=key)
    js(s, "document.getElementById('auth-form').requestSubmit(); true")
    plots_ready = ("document.body.dataset.updates >= 4 && [...document.querySelectorAll('canvas[data-plot]')]"
                   ".every(c => Number(c.dataset.points) > 0)")
    wait_for(s, plots_ready, "four updates with data in every plot")
    assert js(s, "sessionStorage.getItem('lorasink.api_key')") == key, "the key is not in sessionStorage"
    assert key not in js(s, "location.href"), "the key is in the URL"
    assert js(s, "localStorage.length") == 0, "something was written to localStorage"
    print("PASS browser: the page asked for the key once and keeps it in sessionStorage, not the URL")

    # A reload in the same tab finds the key: no form this time.
    js(s, "window.beforeReload = true")
    call("Page.reload", s)
    wait_for(s, "!window.beforeReload && document.readyState === 'complete' && document.body.dataset.updates >= 3",
             "updates after a reload")
    assert js(s, "document.getElementById('auth').dataset.auth") == "ok", "the reloaded page asked again"
    wait_for(s, plots_ready, "data in every plot after the reload")
    # A few more polls, so that the screenshot's plots show a trend.
    wait_for(s, "document.body.dataset.updates >= 12", "twelve updates after the reload")

    dom = js(s, "document.documentElement.outerHTML")
    pool, adapters = get("/pool"), get("/adapters")["adapters"]
    open(tmp + "/dom.html", "w").write(dom)

    class Page(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.slots, self.rows, self.plots = {}, {}, {}
        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            cls = (a.get("class") or "").split()
            if tag == "div" and "slot" in cls and "data-slot" in a:
                self.slots[int(a["data-slot"])] = (a.get("data-adapter"), a.get("data-state"))
            elif tag == "tr" and "data-adapter" in a:
                self.rows[a["data-adapter"]] = a.get("data-state")
            elif tag == "canvas" and "data-plot" in a:
                self.plots[a["data-plot"]] = int(a.get("data-points", "0"))
    page = Page()
    page.feed(dom)

    errors = []
    if len(page.slots) != len(pool["slots"]):
        errors.append("slot grid has %d slots, the pool %d" % (len(page.slots), len(pool["slots"])))
    for sl in pool["slots"]:
        if sl["adapter"] is None:
            continue
        got = page.slots.get(sl["index"], (None, None))
        want_state = "pinned" if sl["pinned"] and sl["state"] == "resident" else sl["state"]
        if got != (sl["adapter"], want_state):
            errors.append("slot %d: page shows %r, pool has %r" % (sl["index"], got, (sl["adapter"], want_state)))
    for a in adapters:
        if a["state"] == "resident" and page.slots.get(a["slot"], (None,))[0] != a["name"]:
            errors.append("resident %s is not in slot %d of the grid" % (a["name"], a["slot"]))
        if page.rows.get(a["name"]) != a["state"]:
            errors.append("registry row of %s: %r, expected state %r" % (a["name"], page.rows.get(a["name"]), a["state"]))
    if len(page.rows) != len(adapters):
        errors.append("registry lists %d adapters, /adapters %d" % (len(page.rows), len(adapters)))
    want_plots = {"tokens", "requests", "latency", "queue", "pool", "batch"}
    if set(page.plots) != want_plots:
        errors.append("plots %s, expected %s" % (sorted(page.plots), sorted(want_plots)))
    errors += ["plot %s has no data" % p for p, n in page.plots.items() if n <= 0]
    if errors:
        raise SystemExit("\n".join(errors))
    print("PASS browser: %d slots (%d resident) in the grid, %d adapters in the registry, plots %s" % (
        len(page.slots), sum(1 for v in page.slots.values() if v[0]), len(page.rows),
        ", ".join("%s=%d" % kv for kv in sorted(page.plots.items()))))

    # Screenshots: the page at full size as the test artifact, a copy
    # scaled down to at most 150 KiB for the README.
    height = js(s, "Math.ceil(document.querySelector('main').getBoundingClientRect().bottom) + 4")
    full = call("Page.captureScreenshot", s, format="png", captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1})["data"]
    open(shot, "wb").write(base64.b64decode(full))
    for scale in (0.75, 0.6, 0.5, 0.4):
        png = base64.b64decode(call("Page.captureScreenshot", s, format="png", captureBeyondViewport=True,
                                    clip={"x": 0, "y": 0, "width": 1280, "height": height, "scale": scale})["data"])
        if len(png) <= 150 * 1024:
            break
    open(small, "wb").write(png)
    print("PASS browser: screenshot %s, README copy %s (%d KiB)" % (shot, small, len(png) // 1024))
finally:
    try:
        call("Browser.close")
    except Exception:
        pass
    try:
        browser.wait(timeout=10)
    except subprocess.TimeoutExpired:
        browser.kill()
PY

# 5. Cross-site requests and DNS rebinding, from pages of other origins.
python3 "$ROOT/scripts/check_cross_site.py" "$BIN" "$TMP" || fail "cross-site checks"

echo "check-dashboard: all passed in $(($(date +%s) - T0)) s"
