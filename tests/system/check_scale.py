"""Adapters, load generator and checks of scripts/check-scale.sh (which
starts the servers and HAProxy):
  check_scale.py adapters --out DIR --hidden H --intermediate F --layers L
  check_scale.py PHASE [options]
Every phase sends its requests (ids PHASE-i), checks every answer against
the reference server, reads HAProxy's log and the replicas' /metrics, and
prints PASS lines; any failed check exits 1. State between phases (each
adapter's home replica) is kept in --state."""
import argparse
import base64
import json
import os
import re
import signal
import threading
import time
import urllib.parse

import lsys

ap = argparse.ArgumentParser()
ap.add_argument("phase")
ap.add_argument("--lb"), ap.add_argument("--ref"), ap.add_argument("--stats")
ap.add_argument("--replicas"), ap.add_argument("--hlog"), ap.add_argument("--state")
ap.add_argument("--hidden", type=int), ap.add_argument("--layers", type=int)
ap.add_argument("--intermediate", type=int), ap.add_argument("--out")
ap.add_argument("--pid", type=int, default=0), ap.add_argument("--victim", type=int, default=0)
A = ap.parse_args()
REPLICAS = (A.replicas or "").split(",")
ADAPTERS = ["ad-%d" % k for k in range(8)]
H = A.hidden


fail, ok = lsys.fail, lsys.ok


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
        v = [((xi * 31 + t * 7 + k * 3) % 29 - 14) / 64.0 for t in range(T) for k in range(H)]
        XCACHE[key] = base64.b64encode(lsys.f32_bytes(v)).decode()
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


class Client(lsys.Client):
    """One keep-alive connection for the forwards (a failed request is
    reported, never retried: that would hide what the client would see);
    get() on a connection of its own, as a scrape would."""

    def get(self, path):
        return lsys.fetch("http://%s:%d" % (self.host, self.port), path, timeout=10)


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
    served = delta(before, after, "requests")
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


def phase_adapters():
    # Rank-4 PEFT adapters for every layer, each with its own values, large
    # enough that a request served with the wrong adapter (or none) gives
    # another y. Odd ones as PEFT directories (save_pretrained's layout),
    # even ones as one file with the parameters in __metadata__.
    n, r, F, out = 2, 4, A.intermediate, A.out
    divs = (64.0, 16.0, 64.0, 16.0)
    for k in range(8):
        name = "ad-%d" % k
        tensors = lsys.shared_expert_lora(
            range(A.layers), H, n, F, r, lambda l, s, i, j: ((i * 7 + j * 3 + s + 5 * k + 11 * l) % 13 - 6) / divs[s],
            prefix="base_model.model.model.layers.%d.mlp.shared_experts.")
        if k % 2:
            os.makedirs(os.path.join(out, name))
            with open(os.path.join(out, name, "adapter_config.json"), "w") as f:
                json.dump({"peft_type": "LORA", "r": r, "lora_alpha": 8, "target_modules": ["gate_up_proj", "down_proj"]},
                          f)
            lsys.write_safetensors(os.path.join(out, name, "adapter_model.safetensors"), tensors, {})
        else:
            lsys.write_safetensors(os.path.join(out, name + ".safetensors"), tensors, {"r": str(r), "lora_alpha": "8"})


def phase_victim():
    print(load_state()["victim"])


{"adapters": phase_adapters, "victim": phase_victim, "sanity": phase_sanity, "affinity": phase_affinity, "hot": phase_hot, "kill": phase_kill, "back": phase_back,
 "rate": phase_rate}[A.phase]()
