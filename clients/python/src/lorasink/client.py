"""Client: every route of lorasink over one kept-alive HTTP connection.

Forwards travel as safetensors bodies (no JSON numbers to write or read):
one adapter for every token in the query, different adapters per token in
the body's metadata.
"""
import http.client
import io
import json
import math
import operator
import os
import select
import socket
import ssl
import threading
import time
import urllib.parse

from . import _tensors
from .errors import LorasinkError

__all__ = ["Client"]

_LOAD_KEYS = ("format", "config", "scale", "gate_up_order", "pinned", "replace", "strict")
# A reused connection that fails with one of these before any byte of an
# answer came was closed by the server while idle: the request is sent
# again once, on a new connection.
_DROPPED = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
# A body this large asks first (Expect: 100-continue): a server that
# refuses it from its head (413, 401, 429) answers before a byte of it is
# sent, where sending it whole would meet a closed connection and lose the
# answer. Below it the body fits the socket buffers and the answer is read.
_EXPECT_BYTES = 1 << 20
# How long to wait for "100 Continue" before sending the body anyway (a
# proxy that does not pass it on), as RFC 9110 lets a client do.
_EXPECT_WAIT = 1.0


class _Replayed(io.RawIOBase):
    """The bytes already read off a socket, then the socket's own: what
    http.client.HTTPResponse reads an answer from (its makefile)."""

    def __init__(self, head, sock):
        self.head, self.sock = head, sock

    def makefile(self, mode):
        return io.BufferedReader(self)

    def readable(self):
        return True

    def readinto(self, b):
        if self.head:
            n = min(len(b), len(self.head))
            b[:n], self.head = self.head[:n], self.head[n:]
            return n
        return self.sock.recv_into(b)


class _HTTP(http.client.HTTPConnection):
    """http.client writes a request's head and body in two sends: without
    TCP_NODELAY the body can wait on the peer's delayed ACK."""

    def connect(self):
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _HTTPS(http.client.HTTPSConnection):
    def connect(self):
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Client:
    """A lorasink server at url ("http://127.0.0.1:8080", or https://).

    api_key: sent as "Authorization: Bearer KEY" (the server's --api-key);
    timeout: seconds for connecting and for each read of an answer;
    ssl_context: for an https url (ssl.create_default_context() if None).
    One Client holds one connection: threads that share it take turns
    (each request whole, under a lock); give each thread its own Client
    for requests in parallel.
    """

    def __init__(self, url, api_key=None, timeout=60.0, ssl_context=None):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"url {url!r}: expected http://HOST:PORT or https://HOST:PORT")
        if u.path not in ("", "/") or u.query:
            raise ValueError(f"url {url!r}: lorasink serves its routes at the root; give no path")
        self.url = f"{u.scheme}://{u.netloc}"
        if u.scheme == "https":
            self._conn = _HTTPS(u.hostname, u.port, timeout=timeout, context=ssl_context)
        else:
            self._conn = _HTTP(u.hostname, u.port, timeout=timeout)
        self._headers = {"User-Agent": "lorasink-python"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.connections_opened = 0  # TCP connections this client opened (1 while keep-alive holds)
        self._lock = threading.Lock()  # one request at a time on the one connection

    def close(self):
        """Closes the connection (the next call opens a new one)."""
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- HTTP ---------------------------------------------------------------

    def _idle_dropped(self):
        """True when the kept-alive socket was closed by the server while
        idle (readable with nothing owed: EOF or a stray byte). Not
        checked over TLS, where a readable socket may hold a session
        ticket: the one retry below covers it."""
        sock = self._conn.sock
        if isinstance(sock, ssl.SSLSocket):
            return False
        try:
            if hasattr(select, "poll"):  # select() refuses fds past 1023
                p = select.poll()
                p.register(sock, select.POLLIN)
                return bool(p.poll(0))
            return bool(select.select([sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def _send(self, method, path, body, headers):
        reused = self._conn.sock is not None
        if reused and self._idle_dropped():
            self._conn.close()
            reused = False
        if not reused:
            self.connections_opened += 1
        try:
            resp = self._exchange(method, path, body, headers)
        except _DROPPED:
            # Only up to the status line: a connection lost while the
            # answer's body is read is raised, never sent again.
            self._conn.close()
            if not reused:
                raise
            self.connections_opened += 1
            resp = self._exchange(method, path, body, headers)
        data = resp.read()
        if getattr(resp, "body_unsent", False):
            self._conn.close()  # the server waits for a body it will never get
        return resp, data

    def _exchange(self, method, path, body, headers):
        """Sends the request and returns the answer's response (its body
        unread). A large body waits for the server's "100 Continue"; an
        answer that comes instead is returned with body_unsent set, as is
        one the server sent before a failed send of the body."""
        conn = self._conn
        try:
            if body is None or len(body) < _EXPECT_BYTES:
                conn.request(method, path, body=body, headers=headers)
                return conn.getresponse()
            conn.putrequest(method, path)
            for k, v in dict(headers, **{"Content-Length": str(len(body)), "Expect": "100-continue"}).items():
                conn.putheader(k, v)
            conn.endheaders()
            early = self._await_continue(conn.sock, method)
            if early is not None:
                return early
            conn.send(body)
        except (BrokenPipeError, ConnectionResetError) as e:
            # The server answered and closed while the body went out (it
            # refused the request from its head): that answer, if it came.
            try:
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException):
                raise e from None
            resp.body_unsent = True
            return resp
        return conn.getresponse()

    @staticmethod
    def _await_continue(sock, method):
        """None once the server said "100 Continue", or said nothing within
        _EXPECT_WAIT (the body is sent then); else its final answer. Reads
        with a timeout rather than select(): over TLS a readable socket may
        hold only a session ticket, and select() refuses fds past 1023."""
        saved, head = sock.gettimeout(), b""
        deadline = time.monotonic() + _EXPECT_WAIT
        try:
            while len(head) < 12:  # "HTTP/1.1 100"
                if not head:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    sock.settimeout(left)
                try:
                    got = sock.recv(12 - len(head))
                except socket.timeout:  # TimeoutError from Python 3.10 on
                    if head:
                        raise
                    return None
                if not got:
                    raise http.client.RemoteDisconnected("the server closed the connection before answering")
                head += got
                sock.settimeout(saved)
            if head[9:12] != b"100":
                resp = http.client.HTTPResponse(_Replayed(head, sock), method=method)
                resp.begin()
                resp.body_unsent = True
                return resp
            while not head.endswith(b"\r\n\r\n"):  # the rest of the interim answer
                got = sock.recv(1)
                if not got:
                    raise http.client.RemoteDisconnected("the server closed the connection after 100 Continue")
                head += got
            return None
        finally:
            sock.settimeout(saved)

    def _request(self, method, path, body=None, content_type=None, ok=(200,), timeout=None):
        """(status, response, body bytes) of a request; an answer not in
        ok raises LorasinkError with the server's error body. timeout:
        seconds for this request's connect and reads, if shorter than the
        client's."""
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        with self._lock:
            saved = self._conn.timeout
            if timeout is not None:
                self._set_timeout(timeout if saved is None else min(saved, timeout))
            try:
                resp, data = self._send(method, path, body, headers)
            except (OSError, http.client.HTTPException) as e:
                self._conn.close()
                raise LorasinkError(None, "connection_error", f"{method} {self.url}{path}: {e!r}") from e
            finally:
                if timeout is not None:
                    self._set_timeout(saved)
        if resp.status not in ok:
            raise LorasinkError.from_reply(resp.status, data, _retry_after(resp.getheader("Retry-After")),
                                           resp.getheader("X-Request-Id"))
        return resp.status, resp, data

    def _set_timeout(self, seconds):
        self._conn.timeout = seconds
        if self._conn.sock is not None:
            self._conn.sock.settimeout(seconds)

    def _json(self, method, path, body=None, ok=(200,), timeout=None):
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        status, resp, data = self._request(method, path, payload, ok=ok, timeout=timeout)
        try:
            return json.loads(data)
        except ValueError as e:
            raise _not_ours(status, resp, data, f"{method} {path}: the answer is not JSON ({e})") from e

    # -- status routes --------------------------------------------------------

    def health(self):
        """GET /health: {"status": "ok"} while the process serves."""
        return self._json("GET", "/health")

    def ready(self):
        """GET /ready: {"status": "ready", "backend", ...}; raises
        LorasinkError (503 device_error or shutting_down) when not ready."""
        return self._json("GET", "/ready")

    def wait_ready(self, timeout=60.0, interval=0.05):
        """Polls /ready until it answers 200, at most timeout seconds;
        raises the last LorasinkError past it."""
        deadline = time.monotonic() + timeout
        while True:
            # Each try waits no longer than what is left (a server that
            # accepts but never answers must not hold it for the client's
            # whole timeout).
            try:
                return self._json("GET", "/ready", timeout=max(deadline - time.monotonic(), 0.01))
            except LorasinkError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(min(interval, max(deadline - time.monotonic(), 0)))

    def model(self):
        """GET /model: n, hidden, intermediate, layers, dtype, gate, ..."""
        return self._json("GET", "/model")

    def pool(self):
        """GET /pool: slots, capacity, host_cache, counters."""
        return self._json("GET", "/pool")

    def metrics(self):
        """GET /metrics: the Prometheus text."""
        return self._request("GET", "/metrics")[2].decode("utf-8")

    # -- adapters -------------------------------------------------------------

    def adapters(self):
        """GET /adapters: the list of registered adapters."""
        return self._json("GET", "/adapters")["adapters"]

    def adapter(self, name):
        """GET /adapters/{name}: one adapter (404 adapter_not_found)."""
        return self._json("GET", "/adapters/" + urllib.parse.quote(name, safe=""))

    def delete(self, name):
        """DELETE /adapters/{name}: {"deleted", "version", "in_flight"}."""
        return self._json("DELETE", "/adapters/" + urllib.parse.quote(name, safe=""))

    def load(self, name, *, path=None, peft_dir=None, tensors=None, **options):
        """POST /adapters: registers an adapter and returns its description.

        Exactly one of: path (a PEFT directory or .safetensors file beneath
        the server's --adapter-dir, read by the server); peft_dir (a PEFT
        directory on this machine: its adapter_config.json and
        adapter_model.safetensors are uploaded as they are); tensors (a
        dict of tensor name -> numpy array or torch tensor, PEFT or pool
        format). Options, as the server's JSON keys: config (a dict as in
        adapter_config.json; for tensors it is how the scale is stated),
        format ("peft", "pool", "auto"), scale, gate_up_order, pinned,
        replace, strict.
        """
        return self._json("POST", "/adapters", _load_body(name, path, peft_dir, tensors, options), ok=(201,))

    def validate(self, name=None, *, path=None, peft_dir=None, tensors=None, **options):
        """POST /adapters/validate: the same forms as load, touching
        nothing; returns {"valid": true, "rank", "scale", "sha256", ...}."""
        return self._json("POST", "/adapters/validate", _load_body(name, path, peft_dir, tensors, options))

    # -- forward --------------------------------------------------------------

    def forward(self, layer, x, gammas=None, adapters=None, *, return_meta=False):
        """POST /forward: y [T, H] for x [T, H] at the checkpoint's layer.

        x, gammas: numpy arrays or torch tensors (float32, float16 and
        bfloat16 are sent as they are; other types as float32); gammas
        [T, n], or None for the server's default (ones, or the model's
        shared-expert gate). adapters: None (the base model), one name for
        every token, or a list of T names or Nones. y is float32, the
        server's exact values: a numpy array, or for a torch x a torch
        tensor on x's device. return_meta: also return
        {"layer", "tokens", "adapters": [{"name", "version", "slot"}]}.
        """
        xw = _tensors.to_wire(x, "x")
        gw = None if gammas is None else _tensors.to_wire(gammas, "gammas")
        one, per_token = adapters, None
        if adapters is not None and not isinstance(adapters, str):
            # A list that names one adapter (or none) for every token goes
            # as the query's ?adapter=, which a proxy can route on; any
            # other, in the body's metadata (one of another length for the
            # server to refuse: 422 invalid_shape).
            adapters = list(adapters)
            tokens = xw.shape[0] if xw.shape else -1
            same = len(adapters) == tokens and len(set(adapters)) == 1
            one, per_token = (adapters[0], None) if same else (None, adapters)
        y, meta = self._forward_st(layer, xw, gw, one, per_token)
        if _tensors.is_torch(x):
            import torch

            y = torch.from_numpy(y).to(x.device)
        return (y, meta) if return_meta else y

    def _forward_st(self, layer, xw, gw, adapter, per_token):
        if isinstance(layer, bool):  # an int to operator.index, but never meant as a layer
            raise TypeError("layer must be an integer, not a bool")
        query = {"layer": operator.index(layer)}  # 0.9 is a mistake, never layer 0
        if adapter is not None:
            query["adapter"] = adapter
        tensors = {"x": xw} if gw is None else {"x": xw, "gammas": gw}
        metadata = None if per_token is None else {"adapters": json.dumps(per_token)}
        body = _tensors.st_encode(tensors, metadata)
        path = "/forward?" + urllib.parse.urlencode(query)
        status, resp, data = self._request("POST", path, body, "application/octet-stream")
        try:
            out, meta = _tensors.st_decode(data)
            y = _tensors.wire_to_numpy(out["y"])
            return y, {"layer": int(meta["layer"]), "tokens": y.shape[0], "adapters": json.loads(meta["adapters"])}
        except (ValueError, KeyError, TypeError) as e:
            raise _not_ours(status, resp, data, f"POST /forward: the answer is not lorasink's y ({e!r})") from e


def _retry_after(value):
    """Retry-After's seconds (whole, rounded up), or None for a date or
    nothing."""
    try:
        s = float(value)
    except (TypeError, ValueError):
        return None
    return math.ceil(s) if math.isfinite(s) and s >= 0 else None


def _not_ours(status, resp, data, what):
    """A success status whose body is not lorasink's (a proxy's page, a
    captive portal): LorasinkError http_error, the body's start quoted."""
    text = data[:120].decode("utf-8", "replace").strip()
    return LorasinkError(status, "http_error", f"{what}: {text!r}", None, None, 0, None, resp.getheader("X-Request-Id"))


def _load_body(name, path, peft_dir, tensors, options):
    """The JSON body of POST /adapters (and /validate) for one of the
    three forms."""
    unknown = set(options) - set(_LOAD_KEYS)
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)}; known: {list(_LOAD_KEYS)}")
    if sum(v is not None for v in (path, peft_dir, tensors)) != 1:
        raise TypeError("give exactly one of path=, peft_dir= and tensors=")
    body = {} if name is None else {"name": name}
    if path is not None:
        body["path"] = os.fspath(path)
    elif peft_dir is not None:
        config, tensors = _read_peft_dir(os.fspath(peft_dir))
        body["config"] = config
        body["tensors"] = {k: _tensors.b64_object(w) for k, w in tensors.items()}
    else:
        body["tensors"] = {k: _tensors.b64_object(_tensors.to_wire(v, k)) for k, v in tensors.items()}
    body.update({k: v for k, v in options.items() if v is not None})
    return body


def _read_peft_dir(d):
    """(adapter_config.json as a dict, name -> Wire) of a PEFT directory;
    the factors keep their stored dtype."""
    cfg_path, st_path = os.path.join(d, "adapter_config.json"), os.path.join(d, "adapter_model.safetensors")
    for p in (cfg_path, st_path):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{p}: a PEFT directory holds adapter_config.json and adapter_model.safetensors")
    with open(cfg_path, encoding="utf-8") as f:
        config = json.load(f)
    with open(st_path, "rb") as f:
        tensors, _ = _tensors.st_decode(f.read())
    bad = [f"{k!r} is {w.dtype}" for k, w in tensors.items() if w.dtype not in ("F32", "F16", "BF16")]
    if bad:  # every one, as the server's own refusal lists them
        raise ValueError(f"{st_path}: lorasink reads F32, F16 and BF16 factors; {len(bad)} tensor(s) are not: "
                         + ", ".join(bad))
    return config, tensors
