"""The dashboard in headless Chromium against a server with an API key (run
by scripts/check-dashboard.sh, which starts the server and its traffic):
  python3 scripts/check_dashboard_page.py URL KEY SHOT.png SMALL.png TMPDIR
The page asks for the key once and keeps it in sessionStorage; its slot
grid, registry and plots say what /pool and /adapters say; SHOT.png is a
full-size screenshot, SMALL.png a copy of at most 150 KiB for the README.
Exit status 0 only when every check passed."""
import base64
import html.parser
import json
import sys
import urllib.request

from cdp_pipe import Browser

url, key, shot, small, tmp = sys.argv[1:6]
browser = Browser(tmp, ("--window-size=1280,1100", "--hide-scrollbars"), name="chromium")


def get(path):
    req = urllib.request.Request(url + path, headers={"Authorization": "Bearer " + key})
    return json.load(urllib.request.urlopen(req, timeout=5))


try:
    s = browser.page(url + "/dashboard")

    # The first fetch gets 401: the page asks for the key.
    browser.wait_for(s, "document.getElementById('auth').dataset.auth === 'needed'", "the API key form")
    browser.js(s, "document.getElementById('auth-key').focus()")
    browser.call("Input.insertText", s, text=key)
    browser.js(s, "document.getElementById('auth-form').requestSubmit(); true")
    plots_ready = ("document.body.dataset.updates >= 4 && [...document.querySelectorAll('canvas[data-plot]')]"
                   ".every(c => Number(c.dataset.points) > 0)")
    browser.wait_for(s, plots_ready, "four updates with data in every plot")
    assert browser.js(s, "sessionStorage.getItem('lorasink.api_key')") == key, "the key is not in sessionStorage"
    assert key not in browser.js(s, "location.href"), "the key is in the URL"
    assert browser.js(s, "localStorage.length") == 0, "something was written to localStorage"
    print("PASS browser: the page asked for the key once and keeps it in sessionStorage, not the URL")

    # A reload in the same tab finds the key: no form this time.
    browser.js(s, "window.beforeReload = true")
    browser.call("Page.reload", s)
    browser.wait_for(s, "!window.beforeReload && document.readyState === 'complete' && "
                     "document.body.dataset.updates >= 3", "updates after a reload")
    assert browser.js(s, "document.getElementById('auth').dataset.auth") == "ok", "the reloaded page asked again"
    browser.wait_for(s, plots_ready, "data in every plot after the reload")
    # A few more polls, so that the screenshot's plots show a trend.
    browser.wait_for(s, "document.body.dataset.updates >= 12", "twelve updates after the reload")

    dom = browser.js(s, "document.documentElement.outerHTML")
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
    height = browser.js(s, "Math.ceil(document.querySelector('main').getBoundingClientRect().bottom) + 4")
    full = browser.call("Page.captureScreenshot", s, format="png", captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1})["data"]
    open(shot, "wb").write(base64.b64decode(full))
    for scale in (0.75, 0.6, 0.5, 0.4):
        png = base64.b64decode(browser.call("Page.captureScreenshot", s, format="png", captureBeyondViewport=True,
                                    clip={"x": 0, "y": 0, "width": 1280, "height": height, "scale": scale})["data"])
        if len(png) <= 150 * 1024:
            break
    open(small, "wb").write(png)
    print("PASS browser: screenshot %s, README copy %s (%d KiB)" % (shot, small, len(png) // 1024))
finally:
    browser.close()
