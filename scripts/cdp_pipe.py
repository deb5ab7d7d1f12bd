"""Headless Chromium driven over the DevTools protocol on a pipe (no port,
no websocket library): Chromium reads commands from fd 3 and writes
replies to fd 4, each a JSON text ended by a NUL byte. For the browser
checks of scripts/check_dashboard_page.py and scripts/check_cross_site.py."""
import json
import os
import subprocess
import time


class Browser:
    """One Chromium process; extra_args are added to its command line, and
    its profile and log are TMP/NAME and TMP/NAME.log."""

    def __init__(self, tmp, extra_args=(), name="chromium-xsite"):
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()

        def child_fds():
            a, b = os.dup(cmd_r), os.dup(res_w)
            os.dup2(a, 3)
            os.dup2(b, 4)
            for fd in (cmd_r, cmd_w, res_r, res_w, a, b):
                if fd > 4:
                    os.close(fd)

        self.proc = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--remote-debugging-pipe", "--user-data-dir=" + os.path.join(tmp, name), *extra_args,
             "about:blank"],
            preexec_fn=child_fds, close_fds=False, stdout=open(os.path.join(tmp, name + ".log"), "w"),
            stderr=subprocess.STDOUT)
        os.close(cmd_r)
        os.close(res_w)
        self.cmd_w, self.res_r = cmd_w, res_r
        self.pending, self.next_id = b"", 0

    def call(self, method, session=None, timeout=30, **params):
        """Sends one command and returns its result (an error raises)."""
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            while b"\0" in self.pending:
                raw, self.pending = self.pending.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.next_id:
                    if "error" in reply:
                        raise RuntimeError("%s: %s" % (method, reply["error"]))
                    return reply["result"]
            if time.time() > deadline:
                raise RuntimeError(method + ": no reply")
            chunk = os.read(self.res_r, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self.pending += chunk

    def page(self, url="about:blank"):
        """A new tab attached in flat mode; returns its session id."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session)
        if url != "about:blank":
            self.call("Page.navigate", session, url=url)
        return session

    def js(self, session, expr):
        """The value of expr in the page (promises awaited)."""
        r = self.call("Runtime.evaluate", session, expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError("%s: %s" % (expr, r["exceptionDetails"]))
        return r["result"].get("value")

    def wait_for(self, session, expr, what, timeout=30):
        """Until expr is true in the page (an error counts as not yet)."""
        guarded = "(() => { try { return !!(%s); } catch (e) { return false; } })()" % expr
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.js(session, guarded):
                return
            time.sleep(0.1)
        raise SystemExit("timed out waiting for " + what)

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
