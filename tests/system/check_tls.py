"""HTTPS in the server itself (--tls-cert, --tls-key, --tls-client-ca), with
the real curl and openssl (ctest's integration_test_tls):
  python3 tests/system/check_tls.py BUILD/lorasink TMPDIR
A throwaway CA, server and client certificates are made with openssl, then:
1. start-up: half a TLS setting is exit 2; a missing, non-PEM or mismatched
   file is exit 1 with a message naming the file and why;
2. one server: TLS 1.2 and 1.3 are served, 1.0 and 1.1 refused (when this
   openssl can still offer them; it says so when it cannot); a client that
   trusts another CA refuses the server; plain HTTP on the TLS port gets no
   byte and a closed connection; an upload and a forward work over TLS;
   the certificate files replaced are served without a restart (a
   connection opened before goes on), and a bad replacement keeps the last
   good one with a log line saying why;
3. with --tls-client-ca: no client certificate, one of another CA and one
   of the CA whose extended key usage is for servers only are refused, one
   of the CA is served, and a new CA file is taken without a restart.
Exit status 0 only when every check passed."""
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import http.client

import lsys

H, F, N, R = 64, 32, 2, 2
LISTEN = re.compile(r"^listening on https://127\.0\.0\.1:(\d+)$", re.M)


# --- certificates -----------------------------------------------------------------

def openssl(*args):
    p = subprocess.run(["openssl"] + list(args), capture_output=True, timeout=60)
    if p.returncode:
        lsys.fail("openssl %s: %s" % (" ".join(args), p.stderr.decode(errors="replace")))


def make_ca(d, name):
    """A self-signed CA: (cert path, key path)."""
    crt, key = os.path.join(d, name + ".pem"), os.path.join(d, name + ".key")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
            "-out", crt, "-days", "2", "-subj", "/CN=" + name, "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return crt, key


def make_leaf(d, name, ca, purpose):
    """A certificate named CN=name issued by ca for purpose (serverAuth for
    127.0.0.1, or clientAuth): (cert path, key path)."""
    crt, key, csr, ext = (os.path.join(d, name + s) for s in (".pem", ".key", ".csr", ".ext"))
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr,
            "-subj", "/CN=" + name)
    with open(ext, "w") as f:
        f.write("extendedKeyUsage=%s\n" % purpose)
        if purpose == "serverAuth":
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial", "-out", crt, "-days", "2",
            "-extfile", ext)
    return crt, key


def replace(path, src):
    """path gets src's bytes by a rename, as a deploy tool writes it."""
    with open(src, "rb") as f:
        data = f.read()
    with open(path + ".new", "wb") as f:
        f.write(data)
    os.replace(path + ".new", path)


# --- the server --------------------------------------------------------------------

def start(binary, args, log, cacert, client=None, timeout=60):
    """lorasink over TLS, ready: (process, port). Waits, bounded, for its
    'listening on https://' line, then for GET /ready 200 through curl."""
    proc = subprocess.Popen([binary, "--demo", "--hidden", str(H), "--intermediate", str(F), "--experts", str(N),
                             "--layers", "2", "--threads", "1", "--port", "0"] + args,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline, port = time.time() + timeout, None
    while True:
        if port is None:
            m = LISTEN.search(lsys.log_tail(log, 1000))
            port = int(m.group(1)) if m else None
        elif curl(port, "/ready", cacert, client)[1] == "200":
            return proc, port
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            lsys.fail("lorasink over TLS did not come up (exit %s); its log ends:\n%s" % (proc.poll(), lsys.log_tail(log)))
        time.sleep(0.05)


def stop(proc):
    proc.terminate()
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def exits_with(binary, args, code, want, d):
    """lorasink with args exits with code before it serves, its output
    saying want."""
    p = subprocess.run([binary, "--demo", "--hidden", str(H), "--intermediate", str(F), "--port", "0"] + args,
                       capture_output=True, timeout=60, cwd=d)
    out = (p.stdout + p.stderr).decode(errors="replace")
    if p.returncode != code or want not in out:
        lsys.fail("lorasink %s: exit %s (want %s), output lacks %r:\n%s" % (" ".join(args), p.returncode, code, want, out))
    lsys.ok("start-up %s: exit %d, %r" % (" ".join(args), code, want))


def curl(port, path, cacert, client=None, extra=()):
    """(curl's exit status, HTTP status as curl writes it, body, stderr)."""
    args = ["curl", "-sS", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}", "--cacert", cacert]
    if client:
        args += ["--cert", client[0], "--key", client[1]]
    p = subprocess.run(args + list(extra) + ["https://127.0.0.1:%d%s" % (port, path)], capture_output=True, timeout=60)
    body, _, code = p.stdout.decode(errors="replace").rpartition("\n")
    return p.returncode, code, body, p.stderr.decode(errors="replace")


def s_client(port, cacert, *args):
    """openssl s_client's handshake with the server: (exit status, output)."""
    p = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % port, "-CAfile", cacert,
                        "-verify_return_error", "-brief"] + list(args),
                       capture_output=True, stdin=subprocess.DEVNULL, timeout=60)
    return p.returncode, (p.stdout + p.stderr).decode(errors="replace")


def wait_log(log, needle, since, timeout=20):
    """Waits, bounded, for needle in the log past byte since."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(log, "rb") as f:
            f.seek(since)
            if needle in f.read().decode(errors="replace"):
                return
        time.sleep(0.05)
    lsys.fail("no %r in the log within %d s; it ends:\n%s" % (needle, timeout, lsys.log_tail(log)))


def wait_peer(port, cacert, subject, timeout=20):
    """Waits, bounded, until a new handshake shows the certificate of subject."""
    deadline, out = time.time() + timeout, ""
    while time.time() < deadline:
        rc, out = s_client(port, cacert)
        if rc == 0 and "Peer certificate: CN = %s" % subject in out:
            return
        time.sleep(0.1)
    lsys.fail("the server did not come to serve CN=%s within %d s; s_client said:\n%s" % (subject, timeout, out))


# --- the checks ------------------------------------------------------------------------

def check_startup(binary, d, ca, srv, other):
    exits_with(binary, ["--tls-cert", srv[0]], 2, "--tls-cert is given without --tls-key", d)
    exits_with(binary, ["--tls-client-ca", ca[0]], 2, "--tls-client-ca is given without --tls-cert", d)
    missing = os.path.join(d, "missing.pem")
    exits_with(binary, ["--tls-cert", missing, "--tls-key", srv[1]], 1, "--tls-cert %s: cannot read it" % missing, d)
    junk = os.path.join(d, "junk.pem")
    with open(junk, "w") as f:
        f.write("not a certificate\n")
    exits_with(binary, ["--tls-cert", junk, "--tls-key", srv[1]], 1, "--tls-cert %s: not a PEM certificate" % junk, d)
    exits_with(binary, ["--tls-cert", srv[0], "--tls-key", junk], 1, "--tls-key %s: not an unencrypted PEM" % junk, d)
    exits_with(binary, ["--tls-cert", srv[0], "--tls-key", other[1]], 1, "the key is not the certificate's", d)
    exits_with(binary, ["--tls-cert", srv[0], "--tls-key", srv[1], "--tls-client-ca", junk], 1,
               "--tls-client-ca %s: not a PEM CA certificate" % junk, d)


def check_versions(port, ca):
    for v, name in (("-tls1_2", "TLSv1.2"), ("-tls1_3", "TLSv1.3")):
        rc, out = s_client(port, ca[0], v)
        if rc or "Protocol version: %s" % name not in out:
            lsys.fail("openssl s_client %s: exit %d:\n%s" % (v, rc, out))
        lsys.ok("%s is served (openssl s_client %s)" % (name, v))
    for v, name in (("-tls1", "TLSv1"), ("-tls1_1", "TLSv1.1")):
        # OpenSSL 3 offers these at security level 0 only.
        rc, out = s_client(port, ca[0], v, "-cipher", "DEFAULT@SECLEVEL=0")
        if "no protocols available" in out:
            print("NOTE %s not checked: this openssl cannot offer it (%s)" % (name, out.strip().splitlines()[-1]),
                  flush=True)
            continue
        if rc == 0 or "CONNECTION ESTABLISHED" in out:
            lsys.fail("openssl s_client %s was served:\n%s" % (v, out))
        lsys.ok("%s is refused (openssl s_client %s: %s)" % (name, v, out.strip().splitlines()[-1]))


def check_wrong_ca(port, other_ca):
    rc, code, _, err = curl(port, "/health", other_ca[0])
    if rc != 60 or code != "000":
        lsys.fail("curl trusting another CA: exit %d, status %s: %s" % (rc, code, err))
    lsys.ok("curl trusting another CA refuses the server (exit 60: %s)" % err.strip())


def check_plain_http(port):
    """A plain HTTP request on the TLS port: no byte back, the connection closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        got = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        except ConnectionResetError:
            pass
    if got:
        lsys.fail("plain HTTP on the TLS port got %r" % got[:200])
    lsys.ok("plain HTTP on the TLS port: no byte back, the connection closed")


def check_head_timeout(port, ca, log):
    """A head that never comes whole (--request-timeout 2): the connection
    is closed. The guard must not write its plain-text 408 into the TLS
    stream, which the client would read as a broken record."""
    ctx = ssl.create_default_context(cafile=ca[0])
    since = os.path.getsize(log)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            try:
                got = s.recv(4096)
            except ssl.SSLError as e:
                lsys.fail("a head past --request-timeout over TLS: the client read %r (plain bytes in the TLS stream?)"
                          % e)
    if got:
        lsys.fail("a head past --request-timeout over TLS got %r" % got[:200])
    wait_log(log, "request timeout: 127.0.0.1", since)
    lsys.ok("a head past --request-timeout over TLS: the connection closed, no plain-text 408 in the TLS stream")


def check_upload_and_forward(port, ca, d):
    path = os.path.join(d, "a1.safetensors")
    lsys.write_safetensors(path, lsys.shared_expert_lora([0, 1], H, N, F, R,
                                                         lambda l, s, i, j: ((i * 7 + j * 3 + s + l) % 11 - 5) / 128.0))
    rc, code, body, err = curl(port, "/adapters?name=a1&lora_alpha=2", ca[0],
                               extra=("-H", "Content-Type: application/octet-stream", "--data-binary", "@" + path))
    if code != "201":
        lsys.fail("upload over TLS: exit %d, status %s: %s %s" % (rc, code, body, err))
    x = "[[%s]]" % ", ".join("0.01" for _ in range(H))
    rc, code, body, err = curl(port, "/forward", ca[0], extra=("-H", "Content-Type: application/json", "-d",
                                                                '{"x": %s, "adapter": "a1", "layer": 1}' % x))
    if code != "200" or '"y"' not in body:
        lsys.fail("forward over TLS: exit %d, status %s: %s %s" % (rc, code, body, err))
    lsys.ok("an upload (201) and a forward with it (200) over TLS")


def check_reload(port, ca, srv, d, log):
    """The files replaced: new handshakes get the new certificate, a
    connection opened before goes on; a bad file keeps the last good one."""
    ctx = ssl.create_default_context(cafile=ca[0])
    kept = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=20)
    kept.request("GET", "/health")
    kept.getresponse().read()
    new = make_leaf(d, "reloaded", ca, "serverAuth")
    since = os.path.getsize(log)
    replace(srv[0], new[0])
    replace(srv[1], new[1])
    wait_peer(port, ca[0], "reloaded")
    lsys.ok("the replaced certificate is served without a restart")
    kept.request("GET", "/health")
    r = kept.getresponse()
    if r.status != 200:
        lsys.fail("a connection opened before the reload: %d" % r.status)
    r.read()
    kept.close()
    lsys.ok("a connection opened before the reload goes on")
    wait_log(log, "certificate files re-read", since)
    since = os.path.getsize(log)
    with open(srv[0] + ".new", "w") as f:
        f.write("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n")
    os.replace(srv[0] + ".new", srv[0])
    wait_log(log, "tls: keeping the current certificate: --tls-cert %s: not a PEM certificate chain" % srv[0], since)
    rc, out = s_client(port, ca[0])
    if rc or "Peer certificate: CN = reloaded" not in out:
        lsys.fail("after a bad certificate file, s_client: exit %d:\n%s" % (rc, out))
    lsys.ok("a bad certificate file keeps the last good one, and the log says why")


def check_probe(binary, port, srv):
    """lorasink --probe, the image's health check: given the server's TLS
    files it asks /ready over HTTPS and exits 0; without them it exits 1
    within seconds, saying the port may be a TLS one."""
    base = [binary, "--probe", "--port", str(port)]
    p = subprocess.run(base + ["--tls-cert", srv[0], "--tls-key", srv[1]], capture_output=True, timeout=30)
    if p.returncode != 0 or b'"status":"ready"' not in p.stdout:
        lsys.fail("--probe over TLS: exit %d, %s %s" % (p.returncode, p.stdout[:200], p.stderr[:300]))
    t0 = time.time()
    p = subprocess.run(base, capture_output=True, timeout=30)
    if p.returncode != 1 or b"a TLS port?" not in p.stderr or time.time() - t0 > 10:
        lsys.fail("--probe in plain HTTP on a TLS port: exit %d after %.1f s: %s" % (p.returncode, time.time() - t0,
                                                                                   p.stderr[:300]))
    lsys.ok("--probe asks /ready over TLS with the server's files (exit 0), and without them exits 1 saying why")


def check_one_line_each(log):
    """Each refused handshake above logs one line: a refused certificate
    its own, with the client's address (it was followed by the generic
    line too), a missing one the generic line."""
    deadline = time.time() + 20
    while True:
        with open(log, encoding="utf-8", errors="replace") as f:
            text = f.read()
        refused, generic = text.count("tls: client certificate from"), text.count("tls: a handshake failed")
        if refused >= 2 or time.time() > deadline:
            break
        time.sleep(0.05)
    if (refused, generic) != (2, 2):
        lsys.fail("four refused handshakes (two certificates refused, two missing) logged %d refused-certificate and "
                  "%d generic lines, not 2 and 2; the log ends:\n%s" % (refused, generic, lsys.log_tail(log)))
    lsys.ok("each refused handshake logs one line, a refused certificate with the client's address")


def check_client_certs(binary, d, ca, other_ca):
    srv = make_leaf(d, "mtls-server", ca, "serverAuth")
    good = make_leaf(d, "good-client", ca, "clientAuth")
    wrong = make_leaf(d, "wrong-client", other_ca, "clientAuth")
    server_only = make_leaf(d, "server-only", ca, "serverAuth")  # the CA's, but not for clients
    client_ca = os.path.join(d, "client-ca.pem")
    replace(client_ca, ca[0])
    log = os.path.join(d, "mtls.log")
    proc, port = start(binary, ["--tls-cert", srv[0], "--tls-key", srv[1], "--tls-client-ca", client_ca], log, ca[0],
                       client=good)
    try:
        for label, client, extra in (("no client certificate", None, ()),
                                     ("no client certificate, TLS 1.2", None, ("--tls-max", "1.2")),
                                     ("a client certificate of another CA", wrong, ()),
                                     ("a certificate of the CA for servers only", server_only, ())):
            rc, code, body, err = curl(port, "/health", ca[0], client, extra)
            if rc == 0 or code != "000":
                lsys.fail("%s: exit %d, status %s: %s" % (label, rc, code, body))
            lsys.ok("%s is refused in the handshake (curl exit %d: %s)" % (label, rc, err.strip()))
        wait_log(log, "tls: client certificate from 127.0.0.1 refused", 0)
        check_one_line_each(log)
        rc, code, body, err = curl(port, "/health", ca[0], good)
        if code != "200":
            lsys.fail("a client certificate of the CA: exit %d, status %s: %s %s" % (rc, code, body, err))
        lsys.ok("a client certificate of --tls-client-ca's CA is served")
        since = os.path.getsize(log)
        replace(client_ca, other_ca[0])
        wait_log(log, "certificate files re-read", since)
        if curl(port, "/health", ca[0], wrong)[1] != "200" or curl(port, "/health", ca[0], good)[1] != "000":
            lsys.fail("after the client CA file changed, its new CA's client is not the one served")
        lsys.ok("a new --tls-client-ca file is taken without a restart")
    finally:
        rc = stop(proc)
    if rc != 0:
        lsys.fail("lorasink with --tls-client-ca exited %d on SIGTERM; its log ends:\n%s" % (rc, lsys.log_tail(log)))


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: check_tls.py BUILD/lorasink TMPDIR")
    binary = os.path.abspath(sys.argv[1])
    os.makedirs(sys.argv[2], exist_ok=True)
    # A directory of this run's own: no certificate or log of an earlier one.
    d = tempfile.mkdtemp(prefix="run-", dir=sys.argv[2])
    ca, other_ca = make_ca(d, "test-ca"), make_ca(d, "other-ca")
    srv, other = make_leaf(d, "server", ca, "serverAuth"), make_leaf(d, "other-server", other_ca, "serverAuth")
    check_startup(binary, d, ca, srv, other)
    log = os.path.join(d, "server.log")
    proc, port = start(binary, ["--tls-cert", srv[0], "--tls-key", srv[1], "--request-timeout", "2"], log, ca[0])
    try:
        check_versions(port, ca)
        check_wrong_ca(port, other_ca)
        check_plain_http(port)
        check_head_timeout(port, ca, log)
        check_upload_and_forward(port, ca, d)
        check_reload(port, ca, srv, d, log)
        check_probe(binary, port, srv)
    finally:
        rc = stop(proc)
    if rc != 0:
        lsys.fail("lorasink over TLS exited %d on SIGTERM; its log ends:\n%s" % (rc, lsys.log_tail(log)))
    check_client_certs(binary, d, ca, other_ca)
    shutil.rmtree(d)  # kept when a check failed, to be read
    lsys.ok("TLS: every check passed")


if __name__ == "__main__":
    main()
