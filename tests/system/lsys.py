"""The one helper of the system checks (tests/system/check_*.py, bench/soak.py,
examples/quickstart_data.py): a built server started on a free port and
stopped, a minimal HTTP client, and the one safetensors writer.

Standard library only, so that every check runs on a stock python3. It
imports nothing from the user client (clients/python): that client needs
numpy and an install, and its codec is what scripts/check-python.sh tests
against the server; an oracle of its own here keeps a shared bug in the
client's codec from hiding one in the server's parser."""
import http.client
import json
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
from array import array


class ServerError(RuntimeError):
    """The server did not come up; the message says why, with its log tail."""


def free_port(host="127.0.0.1"):
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path, lines=20):
    """The last lines of a log file, or '' when it cannot be read."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


# --- safetensors ------------------------------------------------------------

def f32_bytes(values):
    """Little-endian float32 bytes of a flat sequence of numbers."""
    v = array("f", values)
    if sys.byteorder != "little":
        v.byteswap()
    return v.tobytes()


def _flat(values):
    """A flat list of a flat sequence or a list of rows (one level)."""
    if values and isinstance(values[0], (list, tuple)):
        return [x for row in values for x in row]
    return values


def safetensors_bytes(tensors, metadata=None):
    """A safetensors file of F32 tensors, as bytes. tensors: {name: (shape,
    values)}, values flat or a list of rows, written in the dict's order;
    metadata: the __metadata__ strings (no such entry when None). The
    header is padded with spaces to a multiple of 8, as the format allows."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (shape, values) in tensors.items():
        data = f32_bytes(_flat(values))
        count = 1
        for d in shape:
            count *= d
        if len(data) != 4 * count:
            raise ValueError("%s: %d values for shape %s" % (name, len(data) // 4, list(shape)))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def write_safetensors(path, tensors, metadata=None):
    """Writes safetensors_bytes(tensors, metadata) to path."""
    with open(path, "wb") as f:
        f.write(safetensors_bytes(tensors, metadata))


def shared_expert_lora(layers, hidden, experts, inter, rank, value, prefix="model.layers.%d.mlp.shared_experts."):
    """The four PEFT factors of a shared-expert LoRA for each layer, in the
    order PEFT writes them: {name: (shape, flat values)}. value(layer, s, i,
    j) gives factor s's (0 gate_up A, 1 gate_up B, 2 down A, 3 down B)
    entry at row i, column j."""
    shapes = [("gate_up_proj.lora_A", rank, hidden), ("gate_up_proj.lora_B", experts * 2 * inter, rank),
              ("down_proj.lora_A", rank, experts * inter), ("down_proj.lora_B", hidden, rank)]
    out = {}
    for l in layers:
        for s, (mod, rows, cols) in enumerate(shapes):
            vals = [value(l, s, i, j) for i in range(rows) for j in range(cols)]
            out[(prefix % l) + mod + ".weight"] = ((rows, cols), vals)
    return out


# --- HTTP ---------------------------------------------------------------------

class Client:
    """One keep-alive connection to url (http://host:port). A transport
    error is answered as status -1 with the error's repr as the body and
    the connection is dropped (the next request opens another); nothing is
    retried, since a retry would hide what a client sees. headers are sent
    with every request."""

    def __init__(self, url, headers=None, timeout=30):
        u = urllib.parse.urlparse(url)
        self.host, self.port, self.timeout = u.hostname, u.port, timeout
        self.headers = dict(headers or {})
        self.conn = None
        self.last_headers = {}

    def request(self, method, path, body=None, headers=None):
        """(status, body bytes); the answer's headers in self.last_headers."""
        h = dict(self.headers)
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self.conn.request(method, path, body, h)
            r = self.conn.getresponse()
            data = r.read()
            self.last_headers = {k.lower(): v for k, v in r.getheaders()}
            if r.will_close:
                self.close()
            return r.status, data
        except (OSError, http.client.HTTPException) as e:
            self.close()
            return -1, repr(e).encode()

    def get(self, path, headers=None):
        return self.request("GET", path, None, headers)

    def post(self, path, body, headers=None):
        return self.request("POST", path, body, headers)

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.conn = None


def fetch(url, path, method="GET", body=None, headers=None, timeout=10):
    """One request on a connection of its own: (status, body), -1 on a
    transport error."""
    c = Client(url, headers, timeout)
    try:
        return c.request(method, path, body)
    finally:
        c.close()


# --- the server ---------------------------------------------------------------

class Server:
    """A built lorasink started with args (add "--port", "0" for a free
    port: the URL comes from its "listening on" line), its stdout and
    stderr in log_path. start() waits, at most timeout seconds, for that
    line and then for GET /ready 200; when the process exits first or the
    time runs out it raises ServerError naming which, with the log's tail.
    Use as a context manager, or call stop()."""

    LISTEN = re.compile(r"^listening on (http://\S+)", re.M)

    def __init__(self, binary, args, log_path, env=None, ready_headers=None):
        self.binary, self.args, self.log_path = binary, list(args), log_path
        self.env, self.ready_headers = env, ready_headers
        self.proc, self.url = None, None

    def start(self, timeout=60):
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen([self.binary] + self.args, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env)
        finally:
            log.close()
        deadline = time.time() + timeout
        while self.url is None:
            m = self.LISTEN.search(log_tail(self.log_path, 1000))
            if m:
                self.url = m.group(1)
                break
            self._check_alive(deadline, "its 'listening on' line")
            time.sleep(0.05)
        while True:
            st, _ = fetch(self.url, "/ready", headers=self.ready_headers, timeout=5)
            if st == 200:
                return self
            self._check_alive(deadline, "GET /ready 200 (last answer %s)" % st)
            time.sleep(0.1)

    def _check_alive(self, deadline, waiting_for):
        rc = self.proc.poll()
        if rc is not None:
            raise ServerError("%s exited with %s before %s; its log ends:\n%s"
                              % (self.binary, rc, waiting_for, log_tail(self.log_path)))
        if time.time() > deadline:
            self.proc.kill()
            self.proc.wait()
            raise ServerError("%s: no %s in time; its log ends:\n%s"
                              % (self.binary, waiting_for, log_tail(self.log_path)))

    @property
    def port(self):
        return urllib.parse.urlparse(self.url).port

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Sends sig and waits for the exit (SIGKILL after timeout s); its
        exit status, None when it was never started."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc):
        self.stop()


def ok(msg):
    """A PASS line, flushed so it interleaves with the shell's."""
    print("PASS " + msg, flush=True)


def fail(msg):
    """A FAIL line on stderr and exit status 1."""
    print("FAIL " + msg, file=sys.stderr, flush=True)
    sys.exit(1)



if __name__ == "__main__":
    # For the shell around the checks: python3 lsys.py free-port.
    if sys.argv[1:] != ["free-port"]:
        sys.exit("usage: python3 lsys.py free-port")
    print(free_port())
