"""Client: every route of lorasink over one kept-alive HTTP connection.

Forwards travel as safetensors bodies (no JSON numbers to write or read):
one adapter for every token in the query, different adapters per token in
the body's metadata.
"""
import http.client
import json
import os
import select
import socket
import ssl
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
    One Client holds one connection and is not meant to be shared by
    threads at once: give each thread its own.
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
            self._conn.request(method, path, body=body, headers=headers)
            resp = self._conn.getresponse()
        except _DROPPED:
            # Only up to the status line: a connection lost while the
            # answer's body is read is raised, never sent again.
            self._conn.close()
            if not reused:
                raise
            self.connections_opened += 1
            self._conn.request(method, path, body=body, headers=headers)
            resp = self._conn.getresponse()
        return resp, resp.read()

    def _request(self, method, path, body=None, content_type=None, ok=(200,)):
        """(status, response, body bytes) of a request; an answer not in
        ok raises LorasinkError with the server's error body."""
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        try:
            resp, data = self._send(method, path, body, headers)
        except (OSError, http.client.HTTPException) as e:
            self._conn.close()
            raise LorasinkError(None, "connection_error", f"{method} {self.url}{path}: {e!r}") from e
        if resp.status not in ok:
            retry = resp.getheader("Retry-After")
            raise LorasinkError.from_reply(resp.status, data, int(retry) if retry and retry.isdigit() else None,
                                           resp.getheader("X-Request-Id"))
        return resp.status, resp, data

    def _json(self, method, path, body=None, ok=(200,)):
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        return json.loads(self._request(method, path, payload, ok=ok)[2])

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
            try:
                return self.ready()
            except LorasinkError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(interval)

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
        query = {"layer": int(layer)}
        if adapter is not None:
            query["adapter"] = adapter
        tensors = {"x": xw} if gw is None else {"x": xw, "gammas": gw}
        metadata = None if per_token is None else {"adapters": json.dumps(per_token)}
        body = _tensors.st_encode(tensors, metadata)
        path = "/forward?" + urllib.parse.urlencode(query)
        _, _, data = self._request("POST", path, body, "application/octet-stream")
        out, meta = _tensors.st_decode(data)
        y = _tensors.wire_to_numpy(out["y"])
        return y, {"layer": int(meta["layer"]), "tokens": y.shape[0], "adapters": json.loads(meta["adapters"])}


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
