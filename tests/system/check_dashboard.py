"""The dashboard and the metrics end to end (run by scripts/check-dashboard.sh,
which installs chromium and prometheus):
  python3 tests/system/check_dashboard.py BUILD/lorasink SCREENSHOT SMALL_COPY
Starts the server (demo model, small sizes, 3 slots, a host tier of 2, an
API key), loads adapters so that some are resident (one pinned), one is in
the host tier only and some are on disk only, keeps forward traffic
running, then checks:
  1. auth: /dashboard is served without the key, the data routes are not;
  2. promtool check metrics on a scrape;
  3. a real Prometheus (loopback, temporary storage, bearer auth, 1 s
     scrapes) holds one series of each kind (counter, gauge, histogram,
     build_info, process_*, per-adapter, lora_requests_info);
  4. headless Chromium, driven over the DevTools protocol on a pipe
     (cdp_pipe.py): the page asks for the key once (the form), keeps it in
     sessionStorage only (never the URL), and after a reload renders
     without asking; the rendered DOM has every resident adapter in its
     slot, every registered adapter in the registry and data in every
     plot. The screenshot goes to SCREENSHOT and a copy scaled down to at
     most 150 KiB to SMALL_COPY;
  5. pages of another origin against a server without a key
     (check_cross_site.py): both attacks refused (403), nothing changed.
Prints PASS lines; exit status 0 only when every check passed (the logs'
tails are printed on a failure)."""
import base64
import html.parser
import json
import os
import subprocess
import sys
import shutil
import tempfile
import threading
import re
import time
import urllib.parse

import lsys
from cdp_pipe import Browser

H, N, F, R = 64, 2, 32, 4
NAMES = ["pinned-a", "path-b", "path-c", "inline-d", "inline-e", "inline-f"]
fail, ok = lsys.fail, lsys.ok


def write_adapters(adir):
    """Rank-4 PEFT adapters for layer 0 of the model, each with its own values."""
    for k, name in enumerate(NAMES):
        tensors = lsys.shared_expert_lora([0], H, N, F, R, lambda l, s, i, j: ((i * 7 + j * 3 + s + 5 * k) % 13 - 6) / 256.0)
        lsys.write_safetensors(os.path.join(adir, name + ".safetensors"), tensors, {"lora_alpha": "8"})


def check_auth(url):
    # The page holds no data and is open; everything it reads is not.
    c = lsys.Client(url)
    st, page = c.get("/dashboard")
    got = "%s %s" % (st, c.last_headers.get("content-type", ""))
    c.close()
    if got != "200 text/html; charset=utf-8":
        fail("GET /dashboard without the key: " + got)
    if b'id="slots"' not in page:
        fail("/dashboard is not the dashboard page")
    if re.search(rb'(src|href)="(https?:)?//', page):
        fail("/dashboard refers to an external resource")
    for path in ("/pool", "/adapters", "/metrics"):
        st, _ = lsys.fetch(url, path)
        if st != 401:
            fail("GET %s without the key: %s, expected 401" % (path, st))
    ok("auth: /dashboard open, /pool /adapters /metrics answer 401 without the key")


def load_adapters(url, adir, auth):
    """pinned-a, path-b and path-c from paths, then three inline uploads.
    Three slots and a host tier of two end with pinned-a and two inline
    ones resident, one inline one evicted but in the host tier, and path-b
    and path-c evicted with their host copies dropped (disk). Returns the
    names of the resident ones."""
    c = lsys.Client(url, auth)
    for name, pinned in (("pinned-a", True), ("path-b", False), ("path-c", False)):
        body = {"name": name, "path": name + ".safetensors"}
        if pinned:
            body["pinned"] = True
        st, out = c.post("/adapters", body)
        if st // 100 != 2:
            fail("load %s by path: %s %s" % (name, st, out[:300]))
    for name in ("inline-d", "inline-e", "inline-f"):
        with open(os.path.join(adir, name + ".safetensors"), "rb") as f:
            st, out = c.post("/adapters?name=" + name, f.read(), {"Content-Type": "application/octet-stream"})
        if st // 100 != 2:
            fail("upload %s: %s %s" % (name, st, out[:300]))
    st, out = c.get("/adapters")
    c.close()
    if st != 200:
        fail("GET /adapters: %s %s" % (st, out[:300]))
    ads = {a["name"]: a for a in json.loads(out)["adapters"]}
    states = {n: a["state"] for n, a in ads.items()}
    print("adapters:", states)
    checks = [(any(a["state"] == "resident" and a["pinned"] for a in ads.values()), "no pinned resident adapter"),
              (sum(s == "resident" for s in states.values()) >= 2, "fewer than two resident adapters"),
              ("host" in states.values(), "no adapter in the host tier only"),
              ("disk" in states.values(), "no adapter on disk only")]
    for good, what in checks:
        if not good:
            fail("adapter states: " + what)
    ok("adapters in every state: resident (one pinned), host, disk")
    return [a["name"] for a in json.loads(out)["adapters"] if a["state"] == "resident"]


def traffic(url, auth, names, stop):
    """Forwards over the resident adapters and the base model (hits only,
    so the slots hold still while the page is checked), and a few that
    name an unknown adapter (404s, for the 4xx plot), until stop is set."""
    x = [[((t * 5 + i) % 17 - 8) / 64.0 for i in range(H)] for t in range(4)]

    def worker(k):
        c, i = lsys.Client(url, auth, timeout=10), 0
        while not stop.is_set():
            i += 1
            if i % 10 == 0:
                c.post("/forward", {"x": x, "adapter": "no-such-adapter"})
            else:
                c.post("/forward", {"x": x, "adapters": [names[(i + k) % len(names)], None,
                                                         names[(i + k + 1) % len(names)], None]})
            time.sleep(0.02)
        c.close()

    for k in range(3):
        threading.Thread(target=worker, args=(k,), daemon=True).start()


def wait_traffic(url, auth, timeout=30):
    """Until a forward of the traffic has been answered (its counter in
    /metrics), so that the scrapes below see traffic."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, text = lsys.fetch(url, "/metrics", headers=auth)
        if st == 200 and re.search(rb'^lorasink_requests_total\{route="/forward",status="200"\} [1-9]', text, re.M):
            return
        time.sleep(0.1)
    fail("no forward of the traffic answered 200 within %d s" % timeout)


def check_promtool(url, auth, tmp):
    st, text = lsys.fetch(url, "/metrics", headers=auth)
    if st != 200:
        fail("GET /metrics: %s" % st)
    r = subprocess.run(["promtool", "check", "metrics"], input=text, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        print(r.stdout.decode(errors="replace"))
        fail("promtool check metrics")
    samples = sum(1 for line in text.decode().splitlines() if not line.startswith("#"))
    ok("promtool check metrics: clean (%d samples)" % samples)


PROM_KINDS = {
    "counter": 'rate(lorasink_requests_total{route="/forward",status="200"}[10s]) > 0',
    "gauge": "lorasink_pool_slots == 3",
    "histogram": 'histogram_quantile(0.99, sum by (le) (rate(lorasink_request_duration_seconds_bucket{route="/forward"}[10s]))) > 0',
    "build_info": 'lorasink_build_info{backend!="",version!=""} == 1',
    "process": "process_resident_memory_bytes > 0 and process_open_fds > 0",
    "per-adapter": 'lorasink_adapter_requests_total{adapter="pinned-a"} > 0',
    "lora_requests_info": 'lorasink_lora_requests_info{max_lora="3"} == 1',
}


def check_prometheus(url, key, tmp, procs):
    """A real Prometheus scraping the server every second, with the key."""
    pport = lsys.free_port()
    with open(os.path.join(tmp, "key"), "w") as f:
        f.write(key)
    with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: lorasink\n    authorization:\n      type: Bearer\n"
                "      credentials_file: %s/key\n    static_configs:\n      - targets: ['%s']\n"
                % (tmp, urllib.parse.urlparse(url).netloc))
    log = open(os.path.join(tmp, "prometheus.log"), "w")
    procs.append(subprocess.Popen(["prometheus", "--config.file=" + tmp + "/prometheus.yml",
                                   "--storage.tsdb.path=" + tmp + "/tsdb", "--web.listen-address=127.0.0.1:%d" % pport,
                                   "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT))
    base = "http://127.0.0.1:%d" % pport

    def query(q):
        st, body = lsys.fetch(base, "/api/v1/query?" + urllib.parse.urlencode({"query": q}), timeout=5)
        if st != 200:
            return None
        body = json.loads(body)
        return body["data"]["result"] if body.get("status") == "success" else None

    deadline = time.time() + 60
    while True:  # three scrapes that found the target up
        res = query('sum_over_time(up{job="lorasink"}[1m])')
        if res and float(res[0]["value"][1]) >= 3:
            break
        if time.time() > deadline:
            fail("Prometheus queries: Prometheus did not scrape the server three times: %r" % (res,))
        time.sleep(0.5)
    bad = []
    for kind, q in PROM_KINDS.items():
        res = query(q)
        print("  %-18s %-3s %s" % (kind, "ok" if res else "--", q))
        if not res:
            bad.append(kind)
    if bad:
        fail("Prometheus queries: no result for: " + ", ".join(bad))
    ok("prometheus: scraped with the key; a series of each kind answers a query")


class Page(html.parser.HTMLParser):
    """The slot grid, the registry rows and the plots of the rendered DOM."""

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


def need(cond, what):
    """A browser check: what is the failure's message."""
    if not cond:
        raise SystemExit(what)


def check_browser(url, key, shot, small, tmp):
    def get(path):
        st, body = lsys.fetch(url, path, headers={"Authorization": "Bearer " + key}, timeout=5)
        if st != 200:
            raise SystemExit("GET %s: %s" % (path, st))
        return json.loads(body)

    b = Browser(tmp, ["--window-size=1280,1100", "--hide-scrollbars"], name="chromium")
    try:
        browser_steps(b, url, key, shot, small, tmp, get)
    finally:
        b.close()


def check_dom(page, pool, adapters):
    """The rendered grid, registry and plots against /pool and /adapters."""
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


def browser_steps(b, url, key, shot, small, tmp, get):
    s = b.page(url + "/dashboard")

    # The first fetch gets 401: the page asks for the key.
    b.wait_for(s, "document.getElementById('auth').dataset.auth === 'needed'", "the API key form")
    b.js(s, "document.getElementById('auth-key').focus()")
    b.call("Input.insertText", s, text=key)
    b.js(s, "document.getElementById('auth-form').requestSubmit(); true")
    plots_ready = ("document.body.dataset.updates >= 4 && [...document.querySelectorAll('canvas[data-plot]')]"
                   ".every(c => Number(c.dataset.points) > 0)")
    b.wait_for(s, plots_ready, "four updates with data in every plot")
    need(b.js(s, "sessionStorage.getItem('lorasink.api_key')") == key, "the key is not in sessionStorage")
    need(key not in b.js(s, "location.href"), "the key is in the URL")
    need(b.js(s, "localStorage.length") == 0, "something was written to localStorage")
    print("PASS browser: the page asked for the key once and keeps it in sessionStorage, not the URL")

    # A reload in the same tab finds the key: no form this time.
    b.js(s, "window.beforeReload = true")
    b.call("Page.reload", s)
    b.wait_for(s, "!window.beforeReload && document.readyState === 'complete' && document.body.dataset.updates >= 3",
               "updates after a reload")
    need(b.js(s, "document.getElementById('auth').dataset.auth") == "ok", "the reloaded page asked again")
    b.wait_for(s, plots_ready, "data in every plot after the reload")
    # A few more polls, so that the screenshot's plots show a trend.
    b.wait_for(s, "document.body.dataset.updates >= 12", "twelve updates after the reload")

    dom = b.js(s, "document.documentElement.outerHTML")
    pool, adapters = get("/pool"), get("/adapters")["adapters"]
    with open(tmp + "/dom.html", "w") as f:
        f.write(dom)

    page = Page()
    page.feed(dom)

    check_dom(page, pool, adapters)

    # Screenshots: the page at full size as the test artifact, a copy
    # scaled down to at most 150 KiB for the README.
    height = b.js(s, "Math.ceil(document.querySelector('main').getBoundingClientRect().bottom) + 4")
    full = b.call("Page.captureScreenshot", s, format="png", captureBeyondViewport=True,
                  clip={"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1})["data"]
    with open(shot, "wb") as f:
        f.write(base64.b64decode(full))
    for scale in (0.75, 0.6, 0.5, 0.4):
        png = base64.b64decode(b.call("Page.captureScreenshot", s, format="png", captureBeyondViewport=True,
                                      clip={"x": 0, "y": 0, "width": 1280, "height": height, "scale": scale})["data"])
        if len(png) <= 150 * 1024:
            break
    with open(small, "wb") as f:
        f.write(png)
    print("PASS browser: screenshot %s, README copy %s (%d KiB)" % (shot, small, len(png) // 1024))


def main():
    binary, shot, small = sys.argv[1:4]
    tmp = tempfile.mkdtemp(prefix="check-dashboard.")
    key = "dash-" + os.urandom(8).hex()
    auth = {"Authorization": "Bearer " + key}
    adir = os.path.join(tmp, "adapters")
    os.makedirs(adir)
    write_adapters(adir)
    srv = lsys.Server(binary, ["--demo", "--hidden", str(H), "--intermediate", str(F), "--slots", "3", "--host-cache", "2",
                               "--adapter-dir", adir, "--port", "0", "--api-key", key, "--threads", "1",
                               "--http-threads", "4", "--log-level", "warn"], os.path.join(tmp, "server.log"))
    procs, stop, passed = [], threading.Event(), False
    try:
        try:
            srv.start(timeout=30)
        except lsys.ServerError as e:
            fail("the server did not start: %s" % e)
        check_auth(srv.url)
        resident = load_adapters(srv.url, adir, auth)
        traffic(srv.url, auth, resident, stop)
        wait_traffic(srv.url, auth)
        check_promtool(srv.url, auth, tmp)
        check_prometheus(srv.url, key, tmp, procs)
        try:
            check_browser(srv.url, key, shot, small, tmp)
        except (RuntimeError, SystemExit) as e:
            fail("browser checks: %s" % e)
        # 5. Cross-site requests and DNS rebinding, from pages of other origins.
        rc = subprocess.call([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                           "check_cross_site.py"), binary, tmp])
        if rc != 0:
            fail("cross-site checks")
        passed = True
    finally:
        stop.set()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        srv.stop()
        if not passed:
            for log in sorted(os.listdir(tmp)):
                if log.endswith(".log") and os.path.getsize(os.path.join(tmp, log)):
                    print("--- %s (tail)\n%s" % (log, lsys.log_tail(os.path.join(tmp, log))), end="")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
