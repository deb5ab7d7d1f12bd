"""docs/openapi.json against a running server (run by scripts/check-openapi.sh
with the Python of .venv-ci/, which holds the tools):
  python tests/system/check_openapi.py BUILD/lorasink
The document is valid OpenAPI 3.1, GET /openapi.json serves the same
bytes, examples/make_adapters.py makes every adapter form and each loads
(201) and serves a forward, a bounded schemathesis run finds no 5xx and no
response the document does not describe, and the server exits 0 on
SIGTERM. Exit status 0 only when all of that holds."""
import os
import shutil
import subprocess
import sys
import tempfile

import lsys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOC = os.path.join(ROOT, "docs", "openapi.json")
BIN = os.path.dirname(sys.executable)  # the venv's tools sit beside its python
# Small sizes keep the run fast; the example is made for the same ones.
H, F, N, L = 64, 32, 2, 2
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
          "response_headers_conformance")


def die(msg, log=None):
    print("check-openapi: " + msg, file=sys.stderr, flush=True)
    if log:
        print(lsys.log_tail(log, 40), file=sys.stderr)
    sys.exit(1)


def step(title, cmd, **kw):
    print("== " + title, flush=True)
    if subprocess.call(cmd, **kw) != 0:
        die(title + " failed (above)")


def same_bytes(url):
    c = lsys.Client(url)
    st, body = c.get("/openapi.json")
    ctype = c.last_headers.get("content-type", "")
    c.close()
    with open(DOC, "rb") as f:
        if st != 200 or body != f.read():
            die("GET /openapi.json (%s) differs from docs/openapi.json: rebuild the server" % st)
    if not ctype.startswith("application/json"):
        die("GET /openapi.json has Content-Type " + ctype)
    print("same bytes,", len(body), flush=True)


def schemathesis(url, tmp):
    # Run from the temp dir: schemathesis keeps its state in ./.schemathesis.
    # Bounded in examples per operation and in time; the seed keeps a CI
    # run reproducible (LORASINK_ST_SEED overrides it).
    print("== schemathesis", flush=True)
    log = os.path.join(tmp, "st.log")
    cmd = [os.path.join(BIN, "st"), "run", DOC, "--url", url, "--checks", CHECKS,
           "--max-examples", os.environ.get("LORASINK_ST_EXAMPLES", "25"),
           "--max-time", os.environ.get("LORASINK_ST_SECONDS", "90"), "--workers", "1",
           "--seed", os.environ.get("LORASINK_ST_SEED", "20261130"), "--request-timeout", "20",
           "--generation-database", "none", "--no-color"]
    with open(log, "w") as out:
        try:
            rc = subprocess.call(cmd, cwd=tmp, stdout=out, stderr=subprocess.STDOUT, timeout=240)
        except subprocess.TimeoutExpired:
            rc = "timeout"
    with open(log, errors="replace") as f:
        text = f.read()
    if rc != 0:
        print("".join(text.splitlines(True)[-150:]))
        die("schemathesis found failures (above)")
    at = text.find("= SUMMARY =")
    print(text[text.rfind("\n", 0, at) + 1:] if at >= 0 else "", end="", flush=True)


def main():
    binary = sys.argv[1]
    step("openapi-spec-validator", [os.path.join(BIN, "openapi-spec-validator"), "docs/openapi.json"], cwd=ROOT)
    tmp = tempfile.mkdtemp(prefix="check-openapi.")
    adir = os.path.join(tmp, "adapters")
    os.makedirs(adir)
    log = os.path.join(tmp, "server.log")
    srv = lsys.Server(binary, ["--demo", "--experts", str(N), "--hidden", str(H), "--intermediate", str(F),
                               "--layers", str(L), "--slots", "4", "--max-rank", "16", "--port", "0",
                               "--adapter-dir", adir, "--log-level", "warn"], log)
    try:
        try:
            srv.start(timeout=30)
        except lsys.ServerError as e:
            die("the server did not start: %s" % e)
        print("== server on " + srv.url, flush=True)
        print("== GET /openapi.json is docs/openapi.json", flush=True)
        same_bytes(srv.url)
        step("examples/make_adapters.py: every form loads and serves",
             [sys.executable, os.path.join(ROOT, "examples", "make_adapters.py"), "--out", adir, "--experts", str(N),
              "--hidden", str(H), "--intermediate", str(F), "--layers", str(L), "--server", srv.url])
        schemathesis(srv.url, tmp)
        print("== the server stops cleanly", flush=True)
        rc = srv.stop()
        if rc != 0:
            die("the server exited with %s" % rc, log)
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
