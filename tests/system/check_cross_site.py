"""Pages of another origin against a server without an API key, in
headless Chromium (run by tests/system/check_dashboard.py):
  python3 tests/system/check_cross_site.py BUILD/lorasink TMPDIR
1. cross-site request forgery: a page served from another port (another
   origin) replaces and pins the adapter "prod" with its own factors, the
   way a page once could: fetch(..., {mode: "no-cors"}) with a text/plain
   and a form-urlencoded JSON body, and navigator.sendBeacon. The server
   must see the requests (403 forbidden_origin in its metrics) and "prod"
   must stay as it was;
2. DNS rebinding: a page at http://rebind.test:PORT/ (Chromium maps the
   name to 127.0.0.1) is loaded from a plain web server on PORT; that
   server goes away and a lorasink takes PORT, as when the attacker's DNS
   name starts to resolve to the victim. The page's same-origin fetches
   then reach lorasink with Host: rebind.test:PORT and must get 403
   forbidden_host, not the registry; a POST must not load an adapter.
Exit status 0 only when every check passed."""
import http.server
import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.request

import lsys
from cdp_pipe import Browser

H, F, N, R = 64, 32, 2, 2
PREFIX = "model.layers.0.mlp.shared_experts."


def adapter(name, seed, **extra):
    """An inline PEFT upload of rank R for the model started below."""
    def mat(rows, cols, s):
        return [[((i * 7 + j * 3 + s + seed) % 11 - 5) / 128.0 for j in range(cols)] for i in range(rows)]
    tensors = {PREFIX + "gate_up_proj.lora_A.weight": mat(R, H, 1), PREFIX + "gate_up_proj.lora_B.weight": mat(N * 2 * F, R, 2),
               PREFIX + "down_proj.lora_A.weight": mat(R, N * F, 3), PREFIX + "down_proj.lora_B.weight": mat(H, R, 4)}
    return dict({"name": name, "config": {"r": R, "lora_alpha": R}, "tensors": tensors}, **extra)


free_port = lsys.free_port


def start_server(binary, port, log):
    """lorasink without a key on port (0: any), ready; returns (process, url)."""
    srv = lsys.Server(binary, ["--demo", "--hidden", str(H), "--intermediate", str(F), "--layers", "1", "--slots", "3",
                               "--max-rank", "4", "--threads", "1", "--port", str(port)], log)
    try:
        srv.start(timeout=30)
    except lsys.ServerError as e:
        sys.exit("lorasink did not start: %s" % e)
    return srv.proc, srv.url


def request(url, method="GET", body=None):
    """(status, body text) of a request as a program (no Origin) sends it."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(url, sample):
    _, text = request(url + "/metrics")
    m = re.search("^" + re.escape(sample) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


class Pages(http.server.BaseHTTPRequestHandler):
    """Serves the pages in self.server.pages by path."""

    # Chromium opens spare connections to an origin before it needs them;
    # an idle one is dropped soon, so that a request made after the server
    # has gone cannot reach its leftover thread.
    timeout = 0.5

    def do_GET(self):
        page = self.server.pages.get(self.path.split("?")[0])
        if page is None:
            self.send_error(404)
            return
        body = page.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve(port, pages):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Pages)
    httpd.pages = pages
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


CSRF_PAGE = """<!DOCTYPE html><title>attack</title><script>
const target = %(target)s, body = %(body)s;
(async () => {
  for (const type of ["text/plain", "application/x-www-form-urlencoded"]) {
    try { await fetch(target + "/adapters", {method: "POST", mode: "no-cors", headers: {"Content-Type": type}, body}); }
    catch (e) {}
  }
  navigator.sendBeacon(target + "/adapters", body);
  // Not a simple method: the browser asks first (a preflight), and sends
  // the DELETE only if the answer allows it.
  try { await fetch(target + "/adapters/prod", {method: "DELETE"}); } catch (e) {}
  document.title = "sent";
})();
</script>"""

REBIND_PAGE = """<!DOCTYPE html><title>rebind</title><script>
window.steal = async () => {
  const r = await fetch("/adapters", {cache: "no-store"});
  return r.status + " " + await r.text();
};
window.plant = async (body) => {
  const r = await fetch("/adapters", {method: "POST", headers: {"Content-Type": "application/json"}, body});
  return r.status + " " + await r.text();
};
</script>"""


def check_csrf(browser, binary, tmp):
    """None when the page changed nothing, else what it did."""
    srv, url = start_server(binary, 0, os.path.join(tmp, "xsite-csrf.log"))
    try:
        status, text = request(url + "/adapters", "POST", adapter("prod", 0))
        assert status == 201, "loading prod: %d %s" % (status, text)
        before = json.loads(request(url + "/adapters/prod")[1])
        forged = json.dumps(adapter("prod", 5, replace=True, pinned=True))
        page_port = free_port()
        httpd = serve(page_port, {"/csrf.html": CSRF_PAGE % {"target": json.dumps(url), "body": json.dumps(forged)}})
        try:
            s = browser.page("http://127.0.0.1:%d/csrf.html" % page_port)
            browser.wait_for(s, "document.title === 'sent'", "the attack page to send its requests")
        finally:
            httpd.shutdown()
            httpd.server_close()
        # The beacon is sent after the page said so: wait for the server
        # to have answered all four uploads and the delete.
        deadline = time.time() + 15
        while metric(url, 'lorasink_requests_total{route="/adapters",status="403"}') < 3 and time.time() < deadline:
            time.sleep(0.1)
        refused = metric(url, 'lorasink_requests_total{route="/adapters",status="403"}')
        deleted = metric(url, 'lorasink_requests_total{route="/adapters/{name}",status="403"}')
        after = json.loads(request(url + "/adapters/prod")[1])
        keys = ("version", "pinned", "sha256")
        if any(after.get(k) != before.get(k) for k in keys):
            return "a page of another origin changed prod: %r -> %r" % ({k: before.get(k) for k in keys},
                                                                       {k: after.get(k) for k in keys})
        if refused < 3 or deleted < 1:
            return ("the server did not refuse the page's requests (403 on /adapters: %g, on /adapters/prod, "
                    "the DELETE's preflight: %g)" % (refused, deleted))
        print("PASS cross-site: a page of another origin sent 3 no-cors uploads and a DELETE preflight; all 403, "
              "prod unchanged"
              " (version %d, pinned %s)" % (after["version"], after["pinned"]))
    finally:
        srv.terminate()
        srv.wait(timeout=30)


def check_rebinding(browser, binary, tmp):
    """None when the rebound page read and loaded nothing, else what it did."""
    port = free_port()
    httpd = serve(port, {"/rebind.html": REBIND_PAGE})
    s = browser.page("http://rebind.test:%d/rebind.html" % port)
    browser.wait_for(s, "typeof window.steal === 'function'", "the rebinding page")
    httpd.shutdown()
    httpd.server_close()
    time.sleep(2 * Pages.timeout)  # every spare connection to the page's server closed
    srv, url = start_server(binary, port, os.path.join(tmp, "xsite-rebind.log"))
    try:
        status, text = request(url + "/adapters", "POST", adapter("secret-adapter", 1))
        assert status == 201, "loading secret-adapter: %d %s" % (status, text)
        got = browser.js(s, "steal()")
        if not got.startswith("403 ") or "forbidden_host" not in got or "secret-adapter" in got:
            return "the rebound page read GET /adapters: " + got[:200]
        planted = browser.js(s, "plant(%s)" % json.dumps(json.dumps(adapter("planted", 2))))
        if not planted.startswith("403 ") or request(url + "/adapters/planted")[0] != 404:
            return "the rebound page loaded an adapter: " + planted[:200]
        print("PASS rebinding: a page whose name now resolves to the server got 403 forbidden_host on GET and POST"
              " /adapters; nothing read, nothing loaded")
    finally:
        srv.terminate()
        srv.wait(timeout=30)


def main():
    binary, tmp = sys.argv[1], sys.argv[2]
    browser = Browser(tmp, ["--host-resolver-rules=MAP rebind.test 127.0.0.1"])
    try:
        failures = [f for f in (check_csrf(browser, binary, tmp), check_rebinding(browser, binary, tmp)) if f]
    finally:
        browser.close()
    for f in failures:
        print("FAIL " + f, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
