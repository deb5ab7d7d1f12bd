#!/usr/bin/env bash
# Three lorasink replicas behind HAProxy (deploy/haproxy/), end to end, on
# loopback:
#   bash scripts/check-scale.sh [BUILD_DIR]     (default: build)
# Writes 8 PEFT adapters into a temporary shared adapter directory (4 as
# NAME.safetensors, 4 as NAME/ directories), starts one reference server
# and the 3 replicas with HAProxy (deploy/haproxy/run.sh's functions, all
# with --auto-load), then, with a Python load generator (stdlib only):
#   1. affinity: one request at a time, mixed adapters and base model: every
#      adapter is served and loaded, once, on exactly one replica (the
#      replicas' own /metrics counters say where). With one request in
#      flight the load bound never binds, so here no spill is allowed;
#   2. bounded load: 12 clients at once on one adapter and nothing else: it
#      is served beyond its home and loaded, once, on each replica it spilled
#      to, and no other adapter moves. That is how a spill is told apart from
#      a misroute: a spill only happens under concurrency, only for the
#      adapter that is hot, and only onto replicas that then serve it;
#   3. failover: mixed traffic from 4 clients, the home replica of the most
#      adapters gets SIGKILL mid-run: no client sees a failure (allowed: 0;
#      HAProxy's retries are counted from its log and stats and printed), its
#      adapters are served and loaded on the others;
#   4. return: that replica restarts on its port: once HAProxy has it up
#      again, one request at a time, every adapter is back on its home of 1,
#      and the returned replica loads its adapters again, once each;
#   5. requests/s through HAProxy vs one replica direct (printed, never
#      judged).
# Every answer of every phase is checked bitwise against the reference
# server's answer to the same request (the CPU backend is batch invariant).
# Bounded: a few thousand requests, about a minute on 2 cores; each phase
# has a time limit. Installs haproxy from Debian when missing
# (scripts/install-deps.sh). Exit status 0 only when every check passed.
# Sizes: LORASINK_SCALE_HIDDEN (1024), _INTERMEDIATE (512), _LAYERS (2);
# LORASINK_SCALE_KEEP=1 keeps the logs and HAProxy's configuration.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
BIN=$BUILD/lorasink
T0=$(date +%s)
[ -x "$BIN" ] || { echo "check-scale: $BIN not found: build first" >&2; exit 1; }
H=${LORASINK_SCALE_HIDDEN:-1024} F=${LORASINK_SCALE_INTERMEDIATE:-512} L=${LORASINK_SCALE_LAYERS:-2}

bash "$ROOT/scripts/install-deps.sh" haproxy

# shellcheck source=deploy/haproxy/run.sh
source "$ROOT/deploy/haproxy/run.sh"

TMP=$(mktemp -d)
REF_PID=""
cleanup() {
  local rc=$?
  set +e
  scale_stop
  if [ -n "$REF_PID" ]; then kill "$REF_PID" 2>/dev/null; wait "$REF_PID" 2>/dev/null; fi
  if [ $rc -ne 0 ]; then
    for log in "$TMP"/run/*.log "$TMP"/run/haproxy.err "$TMP"/ref.log; do
      [ -s "$log" ] && { echo "--- $log (tail)"; tail -8 "$log"; }
    done
    echo "check-scale: FAILED ($(($(date +%s) - T0)) s)"
  fi
  if [ "${LORASINK_SCALE_KEEP:-0}" = 1 ]; then echo "check-scale: kept $TMP"; else rm -rf "$TMP"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*" >&2; exit 1; }

ADIR=$TMP/adapters
mkdir -p "$ADIR"
# Rank-4 PEFT adapters for every layer, each with its own values, large
# enough that a request served with the wrong adapter (or none) gives
# another y.
python3 - "$ADIR" "$H" "$F" "$L" <<'PY'
import json, os, struct, sys
out, H, F, L = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
n, r = 2, 4
def safetensors(path, tensors, meta):
    header, blobs, off = {"__metadata__": meta}, [], 0
    for name, (rows, cols, vals) in tensors.items():
        data = struct.pack("<%df" % len(vals), *vals)
        header[name] = {"dtype": "F32", "shape": [rows, cols], "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
for k in range(8):
    name = "ad-%d" % k
    tensors = {}
    for l in range(L):
        p = "base_model.model.model.layers.%d.mlp.shared_experts." % l
        for s, (mod, rows, cols, div) in enumerate([("gate_up_proj.lora_A", r, H, 64.0), ("gate_up_proj.lora_B", n * 2 * F, r, 16.0),
                                                    ("down_proj.lora_A", r, n * F, 64.0), ("down_proj.lora_B", H, r, 16.0)]):
            vals = [((i * 7 + j * 3 + s + 5 * k + 11 * l) % 13 - 6) / div for i in range(rows) for j in range(cols)]
            tensors[p + mod + ".weight"] = (rows, cols, vals)
    if k % 2:  # a PEFT directory, as save_pretrained leaves it
        os.makedirs(os.path.join(out, name))
        json.dump({"peft_type": "LORA", "r": r, "lora_alpha": 8, "target_modules": ["gate_up_proj", "down_proj"]},
                  open(os.path.join(out, name, "adapter_config.json"), "w"))
        safetensors(os.path.join(out, name, "adapter_model.safetensors"), tensors, {})
    else:      # one file, the parameters in __metadata__
        safetensors(os.path.join(out, name + ".safetensors"), tensors, {"r": str(r), "lora_alpha": "8"})
PY

SIZES=(--hidden "$H" --intermediate "$F" --layers "$L" --http-threads 2)

# The reference: one server alone, same model and adapters, asked each
# request on its own (adapters named in the body, not the header).
REF_PORT=$(scale_free_port)
"$BIN" --demo --threads 1 --access-log=false --log-level warn "${SIZES[@]}" --host 127.0.0.1 --port "$REF_PORT" \
  --adapter-dir "$ADIR" --auto-load >"$TMP/ref.log" 2>&1 &
REF_PID=$!
REF=http://127.0.0.1:$REF_PORT

scale_parse --build "$BUILD" --replicas 3 --adapter-dir "$ADIR" --port 0 --stats-port 0 --run-dir "$TMP/run" -- "${SIZES[@]}"
scale_wait_ready "$REF" 60
scale_start_all
LB=http://127.0.0.1:$SCALE_PORT
STATS=http://127.0.0.1:$SCALE_STATS_PORT
REPLICAS=$(for i in 1 2 3; do scale_replica_url "$i"; done | paste -sd,)
pass "3 replicas and HAProxy up ($LB), reference server up ($REF) ($(($(date +%s) - T0)) s)"

cat >"$TMP/drive.py" <<'PY'
"""Load generator and checks for check-scale.sh: drive.py PHASE [options].
Every phase sends its requests (ids PHASE-i), checks every answer against
the reference server, reads HAProxy's log and the replicas' /metrics, and
prints PASS lines; any failed check exits 1. State between phases (each
adapter's home replica) is kept in --state."""
import argparse, base64, http.client, json, os, re, signal, sys, threading, time, urllib.parse
from array import array

ap = argparse.ArgumentParser()
ap.add_argument("phase")
ap.add_argument("--lb"), ap.add_argument("--ref"), ap.add_argument("--stats")
ap.add_argument("--replicas"), ap.add_argument("--hlog"), ap.add_argument("--state")
ap.add_argument("--hidden", type=int), ap.add_argument("--layers", type=int)
ap.add_argument("--pid", type=int, default=0), ap.add_argument("--victim", type=int, default=0)
A = ap.parse_args()
REPLICAS = A.replicas.split(",")
ADAPTERS = ["ad-%d" % k for k in range(8)]
H = A.hidden


def fail(msg):
    print("FAIL " + msg, file=sys.stderr)
    sys.exit(1)


def ok(msg):
    print("PASS " + msg, flush=True)


def load_state():
    return json.load(open(A.state)) if os.path.exists(A.state) else {}


def save_state(st):
    json.dump(st, open(A.state, "w"))


# A request, from its phase and number alone: adapter (or none), how the
# adapter is named, layer, tokens, and which of 61 inputs x is.
def spec(phase, i, kind):
    h = (i * 2654435761 + sum(map(ord, phase)) * 97) & 0xFFFFFFFF
    s = {"id": "%s-%d" % (phase, i), "layer": i % A.layers, "T": 1 + (h >> 8) % 4, "xi": (h >> 4) % 61}
    if kind == "hot":
        s.update(adapter="ad-0", via="header", T=32)
    elif h % 10 < 2:
        s.update(adapter=None, via=None)
    else:
        s["adapter"] = ADAPTERS[(h >> 12) % 8]
        # Mostly the header; some by query (the frontend copies it into the
        # header), some with the body naming it too, or naming it for some
        # tokens and the base model for others.
        s["via"] = ["header", "header", "header", "query", "body+header", "mixed+header"][(h >> 16) % 6]
    return s


XCACHE = {}


def xdata(xi, T):
    key = (xi, T)
    if key not in XCACHE:
        v = array("f", [((xi * 31 + t * 7 + k * 3) % 29 - 14) / 64.0 for t in range(T) for k in range(H)])
        if sys.byteorder != "little":
            v.byteswap()
        XCACHE[key] = base64.b64encode(v.tobytes()).decode()
    return XCACHE[key]


def request(s, for_ref):
    """(path, body, headers) of spec s; the reference gets the adapter in
    the body only."""
    body = {"x": {"dtype": "f32", "shape": [s["T"], H], "data": xdata(s["xi"], s["T"])}, "layer": s["layer"],
            "encoding": "base64"}
    headers = {"Content-Type": "application/json", "X-Request-Id": s["id"]}
    path = "/forward"
    a, via = s["adapter"], s["via"]
    mixed = [a if t % 2 == 0 else None for t in range(s["T"])] if via and via.startswith("mixed") else None
    if for_ref:
        if mixed:
            body["adapters"] = mixed
        elif a:
            body["adapter"] = a
    elif a:
        if via == "query":
            path += "?adapter=" + urllib.parse.quote(a)
        else:
            headers["X-Lorasink-Adapter"] = a
        if via == "body+header":
            body["adapter"] = a
        elif mixed:
            body["adapters"] = mixed
    return path, json.dumps(body).encode(), headers


class Client:
    """One keep-alive connection; a failed request is reported, never
    retried here (that would hide what the client would see)."""

    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.host, self.port, self.c = u.hostname, u.port, None

    def post(self, path, body, headers):
        try:
            if self.c is None:
                self.c = http.client.HTTPConnection(self.host, self.port, timeout=30)
            self.c.request("POST", path, body, headers)
            r = self.c.getresponse()
            return r.status, r.read()
        except Exception as e:  # noqa: BLE001 - any transport error is a client-visible failure
            if self.c:
                self.c.close()
            self.c = None
            return -1, repr(e).encode()

    def get(self, path):
        return self.post_get("GET", path)

    def post_get(self, method, path):
        c = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            c.request(method, path)
            r = c.getresponse()
            return r.status, r.read()
        except Exception as e:  # noqa: BLE001
            return -1, repr(e).encode()
        finally:
            c.close()


def run(url, phase, kind, n, threads, limit_s, kill_at=None):
    """Sends requests phase-0 .. phase-(n-1) from `threads` clients until
    all are sent or limit_s passed; with kill_at, SIGKILLs --pid that many
    seconds in. Returns ({i: (status, y or error, start time)}, seconds,
    kill time or None)."""
    res, lock, nxt = {}, threading.Lock(), [0]
    t0 = time.time()
    killed = [None]

    def worker():
        c = Client(url)
        while True:
            with lock:
                i = nxt[0]
                if i >= n or time.time() - t0 > limit_s:
                    return
                nxt[0] += 1
            path, body, headers = request(spec(phase, i, kind), False)
            start = time.time()
            st, data = c.post(path, body, headers)
            if st == 200:
                data = json.loads(data)["y"]["data"]
            res[i] = (st, data, start)

    def killer():
        time.sleep(kill_at)
        os.kill(A.pid, signal.SIGKILL)
        killed[0] = time.time()

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    if kill_at is not None:
        ts.append(threading.Thread(target=killer))
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return res, time.time() - t0, killed[0]


REFCACHE = {}


def verify(phase, kind, res):
    """Every answer is 200 and its y the reference's, bit for bit."""
    ref = Client(A.ref)
    bad = []
    for i, (st, data, _) in sorted(res.items()):
        s = spec(phase, i, kind)
        if st != 200:
            bad.append("%s: %s %s" % (s["id"], st, data[:200]))
            continue
        key = (s["adapter"], s["via"] if s["via"] and s["via"].startswith("mixed") else "", s["layer"], s["T"], s["xi"])
        if key not in REFCACHE:
            path, body, headers = request(s, True)
            rst, rdata = ref.post(path, body, headers)
            if rst != 200:
                fail("the reference server answered %s to %s: %s" % (rst, s["id"], rdata[:300]))
            REFCACHE[key] = json.loads(rdata)["y"]["data"]
        if data != REFCACHE[key]:
            bad.append("%s: y differs from the reference (adapter %s via %s)" % (s["id"], s["adapter"], s["via"]))
    if bad:
        ids = {b.split(":")[0] for b in bad[:10]}
        lines = [l.rstrip() for l in open(A.hlog, errors="replace") if any(("|%s}" % i) in l for i in ids)]
        fail("%s: %d of %d requests failed or differ:\n  %s\nHAProxy's log of them:\n  %s"
             % (phase, len(bad), len(res), "\n  ".join(bad[:10]), "\n  ".join(lines) or "(none)"))
    return len(res)


LOGRE = re.compile(r"^\S+ \[[^\]]+\] \S+ (\S+)/(\S+) \S+ (-?\d+) \S+ \S+ \S+ \S+ \d+/\d+/\d+/\d+/(\+?)(\d+) \S+ "
                   r"\{([^|}]*)\|([^}]*)\}")


def hlog(prefixes):
    """HAProxy's log lines of the requests whose id starts with one of
    prefixes: id -> (backend, server, status, retries, redispatched, adapter)."""
    time.sleep(0.3)  # HAProxy writes a line once the answer is sent: let the last ones land
    out = {}
    for line in open(A.hlog, errors="replace"):
        m = LOGRE.match(line)
        if m and m.group(7).split("-")[0] in prefixes:
            be, srv, st, redis, retr, ad, rid = m.groups()
            out[rid] = (be, srv, int(st), int(retr), redis == "+", ad or None)
    return out


def metrics(k):
    """Replica k's per-adapter loads and requests, or None when it does not
    answer. These counters, not HAProxy's log, say where an adapter was
    served and loaded: HAProxy may drop a log line when two of its threads
    log at once (its DroppedLogs counter)."""
    st, text = Client(REPLICAS[k - 1]).get("/metrics")
    if st != 200:
        return None
    m = {"loads": {}, "requests": {}}
    for line in text.decode().splitlines():
        mm = re.match(r'^lorasink_adapter_(loads|requests)_total\{adapter="([^"]+)"\} (\S+)$', line)
        if mm:
            m[mm.group(1)][mm.group(2)] = int(float(mm.group(3)))
    return m


def snapshot(replicas=(1, 2, 3)):
    out = {}
    for k in replicas:
        m = metrics(k)
        if m is None:
            fail("replica r%d does not answer /metrics" % k)
        out[k] = m
    return out


def delta(before, after, what):
    """{adapter: {replica: increase of `what`}} between two snapshots
    (replicas in both); a replica missing from before counts from 0."""
    d = {}
    for k, m in after.items():
        for a, v in m[what].items():
            inc = v - before.get(k, {}).get(what, {}).get(a, 0)
            if inc > 0:
                d.setdefault(a, {})[k] = inc
    return d


def fmt(d):
    return ", ".join("%s on %s" % (a, "+".join("r%d" % k for k in sorted(s))) for a, s in sorted(d.items()))


def stats_csv():
    st, text = Client(A.stats).get("/stats;csv")
    rows = [l.split(",") for l in text.decode().splitlines()]
    head = rows[0]
    head[0] = head[0].lstrip("# ")
    return [dict(zip(head, r)) for r in rows[1:]]


def phase_sanity():
    # The adapters matter: one input gives four different y.
    ref, ys = Client(A.ref), set()
    for a in (None, "ad-0", "ad-1", "ad-7"):
        s = {"id": "sanity", "layer": 0, "T": 1, "xi": 3, "adapter": a, "via": "header"}
        st, data = ref.post(*request(s, True))
        if st != 200:
            fail("reference forward with adapter %s: %s %s" % (a, st, data[:300]))
        ys.add(json.loads(data)["y"]["data"])
    if len(ys) != 4:
        fail("the base model and three adapters give only %d distinct y for one input" % len(ys))
    ok("reference: base model and adapters ad-0, ad-1, ad-7 give 4 different y for one input")


def phase_affinity():
    before = snapshot()
    res, secs, _ = run(A.lb, "aff", "mix", 240, 1, 40)
    n = verify("aff", "mix", res)
    after = snapshot()
    served, loaded = delta(before, after, "requests"), delta(before, after, "loads")
    missing = [a for a in ADAPTERS if a not in served]
    if missing:
        fail("affinity: no request for %s was served" % missing)
    # One client: at most one request in flight, so the bound never binds
    # and no adapter may spill: one replica serves it and loads it, once.
    for a in ADAPTERS:
        if len(served[a]) != 1 or loaded.get(a) != {k: 1 for k in served[a]}:
            fail("affinity: with one request at a time %s was served on %s and loaded on %s"
                 % (a, served[a], loaded.get(a)))
    homes = {a: next(iter(s)) for a, s in served.items()}
    by = {}
    for a, k in sorted(homes.items()):
        by.setdefault(k, []).append(a)
    if len(by) < 2:
        fail("affinity: every adapter hashed to one replica (%s); the hash spreads nothing" % by)
    ok("affinity: %d requests, all equal to the reference; each adapter served and loaded (once) on exactly one "
       "replica: %s" % (n, "; ".join("r%d: %s" % (k, " ".join(a)) for k, a in sorted(by.items()))))
    victim = max(sorted(by), key=lambda k: len(by[k]))
    save_state({"homes": homes, "victim": victim})
    print("victim r%d: home of %d adapters" % (victim, len(by[victim])))


def phase_hot():
    st = load_state()
    home = st["homes"]["ad-0"]
    before = snapshot()
    res, secs, _ = run(A.lb, "hot", "hot", 240, 12, 40)
    n = verify("hot", "hot", res)
    after = snapshot()
    served, loaded = delta(before, after, "requests"), delta(before, after, "loads")
    # Only ad-0 was asked for: a spill is ad-0 served beyond its home, and
    # it is loaded exactly where it spilled to; nothing else moved.
    spilled = {k: c for k, c in served.get("ad-0", {}).items() if k != home}
    if not spilled:
        fail("bounded load: 12 clients on ad-0 never spilled from its home r%d (%s)" % (home, served))
    if set(served) != {"ad-0"} or loaded != {"ad-0": {k: 1 for k in spilled}}:
        fail("bounded load: served %s, loaded %s; expected ad-0 only, loaded once where it spilled" % (served, loaded))
    ok("bounded load: %d requests for ad-0 from 12 clients, all equal to the reference: %d on its home r%d, %s "
       "(loaded there once); no other adapter moved"
       % (n, served["ad-0"].get(home, 0), home, ", ".join("%d spilled to r%d" % (c, k) for k, c in sorted(spilled.items()))))


def phase_kill():
    st = load_state()
    v = A.victim
    surv = tuple(k for k in (1, 2, 3) if k != v)
    theirs = sorted(a for a, h in st["homes"].items() if h == v)
    before = snapshot(surv)
    res, secs, killed = run(A.lb, "kill", "mix", 8000, 4, 6.0, kill_at=1.5)
    if killed is None:
        fail("failover: the replica was not killed")
    n = verify("kill", "mix", res)
    after = snapshot(surv)
    served, loaded = delta(before, after, "requests"), delta(before, after, "loads")
    # The victim's adapters were answered (verify above) by the others,
    # which loaded them (ad-0 may have been there already from its spill).
    for a in theirs:
        if not served.get(a):
            fail("failover: no survivor served %s (home r%d)" % (a, v))
        for k in served[a]:
            if after[k]["loads"].get(a, 0) < 1:
                fail("failover: r%d served %s without loading it" % (k, a))
    # Retries, from HAProxy's log (which may miss a line) and its counters.
    lines = hlog({"kill"})
    retried = [l for l in lines.values() if l[3] > 0]
    # How long after the kill requests were still retried: until HAProxy's
    # health checks took the replica out.
    window = max([res[int(rid.split("-")[1])][2] - killed for rid, l in lines.items() if l[3] > 0] or [0])
    row = [r for r in stats_csv() if r["pxname"] == "adapters" and r["svname"] == "r%d" % v][0]
    base = [r for r in stats_csv() if r["pxname"] == "base" and r["svname"] == "r%d" % v][0]
    after_kill = sum(1 for r in res.values() if r[2] > killed)
    ok("failover: %d requests from 4 clients in %.1f s (%d sent after SIGKILL to r%d at 1.5 s); 0 failed, all equal "
       "to the reference; HAProxy retried %d of them (%d on another replica), the last one sent %.2f s after the kill "
       "(r%d: wretr %s, wredis %s in the adapter backend, %s and %s in the base backend; now %s)"
       % (n, secs, after_kill, v, len(retried), sum(1 for l in retried if l[4]), window, v, row["wretr"],
          row["wredis"], base["wretr"], base["wredis"], row["status"]))
    ok("failover: r%d's adapters served and loaded on the others: %s" % (v, fmt({a: served[a] for a in theirs})))


def phase_back():
    st = load_state()
    v = A.victim
    theirs = sorted(a for a, h in st["homes"].items() if h == v)
    before = snapshot()
    before[v] = {"loads": {}, "requests": {}}  # a new process: its counters started at 0
    res, secs, _ = run(A.lb, "back", "mix", 240, 1, 40)
    n = verify("back", "mix", res)
    after = snapshot()
    served, loaded = delta(before, after, "requests"), delta(before, after, "loads")
    # One request at a time again: every adapter on its home of the
    # affinity phase, the victim's back on the victim and loaded there.
    moved = {a: s for a, s in served.items() if set(s) != {st["homes"][a]}}
    if moved or set(served) != set(ADAPTERS):
        fail("return: adapters not (only) on their homes %s: served %s" % (st["homes"], served))
    if {a for a, s in loaded.items() if v in s} != set(theirs) or any(loaded[a] != {v: 1} for a in theirs):
        fail("return: r%d should load %s once each, loaded %s" % (v, theirs, loaded))
    reqs = sum(after[v]["requests"].values())
    ok("return: %d requests, all equal to the reference; every adapter back on its home: r%d served %d requests of %s "
       "and loaded each once" % (n, v, reqs, " ".join(theirs)))


def phase_rate():
    # Both targets warm (every adapter loaded on replica 1 too), then two
    # alternating rounds of the same requests from 4 clients.
    run(REPLICAS[0], "warm", "mix", 64, 1, 30)
    rates = {"lb": [], "direct": []}
    total = 0
    for rnd in range(2):
        for name, url in (("lb", A.lb), ("direct", REPLICAS[0])):
            ph = "rate%s%d" % (name, rnd)
            res, secs, _ = run(url, ph, "mix", 600, 4, 30)
            total += verify(ph, "mix", res)
            rates[name].append(len(res) / secs)
    lb, d = max(rates["lb"]), max(rates["direct"])
    ok("rate: %d requests, all equal to the reference" % total)
    print("rate: through HAProxy to 3 replicas %.0f req/s (rounds %s), one replica direct %.0f req/s (rounds %s); "
          "haproxy/direct ratio %.2f (4 clients, mixed traffic, best round)"
          % (lb, " ".join("%.0f" % r for r in rates["lb"]), d, " ".join("%.0f" % r for r in rates["direct"]), lb / d))


{"sanity": phase_sanity, "affinity": phase_affinity, "hot": phase_hot, "kill": phase_kill, "back": phase_back,
 "rate": phase_rate}[A.phase]()
PY

drive() {
  python3 "$TMP/drive.py" "$1" --lb "$LB" --ref "$REF" --stats "$STATS" --replicas "$REPLICAS" \
    --hlog "$SCALE_RUN/haproxy.log" --state "$TMP/state.json" --hidden "$H" --layers "$L" "${@:2}"
}

drive sanity
drive affinity
VICTIM=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["victim"])' "$TMP/state.json")
drive hot
drive kill --pid "${SCALE_RPID[VICTIM - 1]}" --victim "$VICTIM"
while kill -0 "${SCALE_RPID[VICTIM - 1]}" 2>/dev/null; do sleep 0.1; done
scale_start_replica "$VICTIM"
scale_wait_ready "$(scale_replica_url "$VICTIM")" 60
t=$(date +%s.%N)
scale_wait_up 3 30
pass "return: r$VICTIM restarted on its port; HAProxy had it up again after $(python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$t" "$(date +%s.%N)") s"
drive back --victim "$VICTIM"
drive rate
pass "check-scale ($(($(date +%s) - T0)) s)"
