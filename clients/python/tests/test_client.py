"""lorasink.Client against a real server (the demo model, n=2, H=64, F=32,
two layers): every method, every adapter form, every tensor form of a
forward, the errors, keep-alive and reconnection. Needs numpy and
safetensors (the codec is checked against the library); no torch.

    LORASINK_BIN=build/lorasink python -m unittest discover -s clients/python/tests -p test_client.py
"""
import importlib.util
import json
import os
import pickle
import select
import shutil
import socket
import sys
import tempfile
import threading
import unittest
import urllib.request

import numpy as np

import lorasink
from lorasink import Client, LorasinkError
from lorasink import _tensors

sys.path.insert(0, os.path.dirname(__file__))
from _server import Server, peft_tensors, write_peft_dir  # noqa: E402

N, H, F, R = 2, 64, 32, 4
DEMO = ("--demo", "--experts", str(N), "--hidden", str(H), "--intermediate", str(F), "--layers", "2", "--slots", "4",
        "--max-rank", "8")
CONFIG = {"r": R, "lora_alpha": 8}
rng = np.random.default_rng(7)


def xs(T):
    return rng.standard_normal((T, H), dtype=np.float32)


def pool_format(peft):
    """The pool form of PEFT factors (docs/adapters.md), B not scaled:
    the server folds the scale given with it."""
    out = {}
    for l in (0, 1):
        p = f"base_model.model.model.layers.{l}.mlp.shared_experts."
        a_gu, b_gu = peft[p + "gate_up_proj.lora_A.weight"], peft[p + "gate_up_proj.lora_B.weight"]
        a_d, b_d = peft[p + "down_proj.lora_A.weight"], peft[p + "down_proj.lora_B.weight"]
        q = f"model.layers.{l}.mlp.shared_experts."
        out[q + "gate_up_lora_a"] = np.concatenate([a_gu, a_gu]).reshape(1, 1, 2 * R, H)
        out[q + "gate_up_lora_b"] = b_gu.reshape(1, N, 2 * F, R)
        out[q + "down_lora_a"] = a_d.reshape(R, N, F).transpose(1, 0, 2).reshape(1, N, R, F)
        out[q + "down_lora_b"] = b_d.reshape(1, 1, H, R)
    return out


class Base(unittest.TestCase):
    """One server for the class; adapters a1 (every layer, r=4) and a2
    (layer 1 only, r=2) as PEFT directories beneath its --adapter-dir."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="lorasink-client-")
        cls.t1 = peft_tensors([0, 1], N, H, F, R, seed=1)
        cls.t2 = peft_tensors([1], N, H, F, 2, seed=2)
        write_peft_dir(os.path.join(cls.dir, "a1"), cls.t1, CONFIG)
        write_peft_dir(os.path.join(cls.dir, "a2"), cls.t2, {"r": 2, "lora_alpha": 4})
        cls.server = Server(*DEMO, "--adapter-dir", cls.dir)
        cls.c = Client(cls.server.url)
        cls.c.load("a1", path="a1")
        cls.c.load("a2", path="a2")

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.server.stop()
        shutil.rmtree(cls.dir)


class TestRoutes(Base):
    def test_status_routes(self):
        self.assertEqual(self.c.health(), {"status": "ok"})
        self.assertEqual(self.c.ready()["status"], "ready")
        m = self.c.model()
        self.assertEqual((m["n"], m["hidden"], m["intermediate"], m["layers"]), (N, H, F, [0, 1]))
        p = self.c.pool()
        self.assertEqual((p["capacity"]["slots"], p["capacity"]["max_rank"]), (4, 8))
        self.assertIn("lorasink_", self.c.metrics())

    def test_adapters_adapter_delete(self):
        names = [a["name"] for a in self.c.adapters()]
        self.assertIn("a1", names)
        self.assertEqual(self.c.adapter("a1")["source"], "a1")
        self.c.load("gone", path="a2")
        d = self.c.delete("gone")
        self.assertEqual((d["deleted"], d["version"]), ("gone", 1))
        with self.assertRaises(LorasinkError) as e:
            self.c.adapter("gone")
        self.assertEqual((e.exception.status, e.exception.code), (404, "adapter_not_found"))
        with self.assertRaises(LorasinkError) as e:
            self.c.delete("gone")
        self.assertEqual(e.exception.code, "adapter_not_found")


class TestLoad(Base):
    def sha(self, name):
        return self.c.adapter(name)["sha256"]

    def test_every_form_is_the_same_adapter(self):
        """By path, from a local PEFT directory, as tensors with and
        without PEFT's prefix, f16 tensors and the pool format: one
        sha256 of the normalised factors; validate says the same."""
        want = self.sha("a1")
        before = len(self.c.adapters())
        local = os.path.join(self.dir, "a1")
        forms = {
            "peft_dir": dict(peft_dir=local),
            "tensors": dict(tensors=self.t1, config=CONFIG),
            "unprefixed": dict(tensors={k.removeprefix("base_model.model."): v for k, v in self.t1.items()},
                               config=CONFIG),
            "pool": dict(tensors=pool_format(self.t1), format="pool", scale=2.0),
        }
        for form, kw in forms.items():
            with self.subTest(form=form):
                v = self.c.validate(**kw)
                self.assertEqual((v["valid"], v["sha256"]), (True, want))
        self.assertEqual(len(self.c.adapters()), before, "validate registered something")
        for form, kw in forms.items():
            with self.subTest(form=form):
                self.assertEqual(self.c.load("f-" + form, **kw)["sha256"], want)
                self.c.delete("f-" + form)

    def test_dtypes_kept(self):
        """f16 factors travel as f16: the same adapter as float32
        factors holding the f16 values."""
        t16 = {k: v.astype(np.float16) for k, v in self.t1.items()}
        t32 = {k: v.astype(np.float32) for k, v in t16.items()}
        a = self.c.validate(tensors=t16, config=CONFIG)["sha256"]
        self.assertEqual(a, self.c.validate(tensors=t32, config=CONFIG)["sha256"])
        self.assertNotEqual(a, self.sha("a1"))

    def test_options(self):
        self.assertTrue(self.c.load("opt", path="a1", pinned=True)["pinned"])
        with self.assertRaises(LorasinkError) as e:
            self.c.load("opt", path="a2")
        self.assertEqual((e.exception.status, e.exception.code), (409, "adapter_exists"))
        r = self.c.load("opt", path="a2", replace=True, pinned=False)
        self.assertEqual((r["version"], r["rank"], r["pinned"]), (2, 2, False))
        self.c.delete("opt")
        extra = dict(self.t1)
        attn = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
        extra[attn] = np.zeros((R, H), np.float32)
        self.assertEqual(self.c.validate(tensors=extra, config=CONFIG)["ignored"], [attn])
        with self.assertRaises(LorasinkError) as e:
            self.c.validate(tensors=extra, config=CONFIG, strict=True)
        self.assertEqual((e.exception.status, e.exception.code), (422, "lora_unknown_tensor"))
        self.assertIn(attn, [v.get("tensor") for v in e.exception.violations])

    def test_client_side_mistakes(self):
        with self.assertRaises(TypeError):
            self.c.load("x", path="a1", peft_dir="a1")
        with self.assertRaises(TypeError):
            self.c.load("x")
        with self.assertRaises(TypeError):
            self.c.load("x", path="a1", pined=True)
        with self.assertRaises(FileNotFoundError):
            self.c.load("x", peft_dir=os.path.join(self.dir, "absent"))
        # Factors of a dtype lorasink does not read: every one is named.
        f64 = os.path.join(self.dir, "f64")
        write_peft_dir(f64, {k: v.astype(np.float64) for k, v in self.t1.items()}, CONFIG)
        with self.assertRaises(ValueError) as e:
            self.c.load("x", peft_dir=f64)
        self.assertIn(f"{len(self.t1)} tensor(s) are not", str(e.exception))
        for k in self.t1:
            self.assertIn(repr(k), str(e.exception))


class TestErrors(Base):
    def test_violations(self):
        """Every problem of a bad adapter, each with its fields."""
        bad = dict(self.t1)
        for l in (0, 1):
            k = f"base_model.model.model.layers.{l}.mlp.shared_experts.down_proj.lora_B.weight"
            bad[k] = np.zeros((H, R + 1), np.float32)
        with self.assertRaises(LorasinkError) as e:
            self.c.load("bad", tensors=bad, config=CONFIG)
        err = e.exception
        self.assertEqual((err.status, err.code), (422, err.violations[0]["code"]))
        self.assertGreaterEqual(len(err.violations), 2)
        self.assertEqual({v["layer"] for v in err.violations if "layer" in v}, {0, 1})
        self.assertTrue(err.message and err.hint is not None)
        self.assertIn(err.code, str(err))
        self.assertTrue(err.request_id)
        with self.assertRaises(LorasinkError):
            self.c.adapter("bad")  # nothing was registered

    def test_forward_errors(self):
        cases = [
            (dict(layer=5, x=xs(1)), 400, "invalid_request"),
            (dict(layer=0, x=np.zeros((1, H + 1), np.float32)), 422, "invalid_shape"),
            (dict(layer=0, x=xs(2), gammas=np.ones((2, N + 1), np.float32)), 422, "invalid_shape"),
            (dict(layer=0, x=xs(1), adapters="nope"), 404, "adapter_not_found"),
            (dict(layer=0, x=xs(2), adapters=["a1", "nope"]), 404, "adapter_not_found"),
            (dict(layer=0, x=xs(2), adapters=["a1", "a2", "a1"]), 422, "invalid_shape"),
            (dict(layer=0, x=xs(3), adapters=["a1", "a1"]), 422, "invalid_shape"),
            (dict(layer=0, x=xs(1), adapters=[]), 422, "invalid_shape"),
            (dict(layer=0, x=np.full((1, H), np.nan, np.float32)), 400, "invalid_request"),
        ]
        for kw, status, code in cases:
            with self.subTest(kw=list(kw)), self.assertRaises(LorasinkError) as e:
                self.c.forward(**kw)
            self.assertEqual((e.exception.status, e.exception.code), (status, code), str(e.exception))
        with self.assertRaises(TypeError):
            self.c.forward(0, np.zeros((1, H), np.complex64))
        for layer in (0.9, True, "0"):  # int() would have served layer 0 or 1
            with self.subTest(layer=layer), self.assertRaises(TypeError):
                self.c.forward(layer, xs(1))
        self.assertEqual(self.c.forward(np.int64(1), xs(1)).shape, (1, H))

    def test_no_server(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        with self.assertRaises(LorasinkError) as e:
            Client(f"http://127.0.0.1:{port}", timeout=5).health()
        self.assertEqual((e.exception.status, e.exception.code), (None, "connection_error"))

    def test_bad_url(self):
        for url in ("127.0.0.1:8080", "ftp://h:1", "http://h:1/v1"):
            with self.subTest(url=url), self.assertRaises(ValueError):
                Client(url)


class TestForward(Base):
    def test_tensor_forms(self):
        """float32, float64, float16 and lists, with the server's default
        gammas and explicit ones; y float32 of shape [T, H]."""
        x = xs(3)
        y = self.c.forward(0, x)
        self.assertEqual((y.dtype, y.shape), (np.float32, (3, H)))
        np.testing.assert_array_equal(self.c.forward(0, x.astype(np.float64)), y)
        np.testing.assert_array_equal(self.c.forward(0, x.tolist()), y)
        np.testing.assert_array_equal(self.c.forward(0, x, gammas=np.ones((3, N))), y)
        self.assertFalse(np.array_equal(self.c.forward(0, x, gammas=np.full((3, N), 0.5, np.float32)), y))
        x16 = x.astype(np.float16)
        np.testing.assert_array_equal(self.c.forward(0, x16), self.c.forward(0, x16.astype(np.float32)))
        np.testing.assert_array_equal(self.c.forward(0, np.asfortranarray(x)), y)

    def test_same_as_json_numbers(self):
        """The safetensors and base64 paths give the very floats the
        server writes as JSON numbers (read by another decoder)."""
        x = xs(4)
        for adapters in (None, "a1", ["a1", None, "a2", "a1"]):
            with self.subTest(adapters=adapters):
                body = {"layer": 1, "x": x.tolist()}
                if isinstance(adapters, list):
                    body["adapters"] = adapters
                elif adapters:
                    body["adapter"] = adapters
                req = urllib.request.Request(self.server.url + "/forward", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    want = np.array(json.loads(r.read())["y"], np.float32)
                np.testing.assert_array_equal(self.c.forward(1, x, adapters=adapters), want)

    def test_mixed_adapters_match_each_alone(self):
        """Per-token adapters in one request: each token's y is the
        forward of its adapter alone, bit for bit (the CPU backend is
        batch invariant)."""
        x = xs(12)
        names = ["a1", "a2", None, "a1", "a2", "a2", None, None, "a1", "a2", "a1", None]
        for layer in (0, 1):
            mixed, meta = self.c.forward(layer, x, adapters=names, return_meta=True)
            self.assertEqual(sorted(a["name"] for a in meta["adapters"]), ["a1", "a2"])
            self.assertEqual((meta["layer"], meta["tokens"]), (layer, 12))
            alone = {a: self.c.forward(layer, x, adapters=a) for a in ("a1", "a2", None)}
            for t, a in enumerate(names):
                np.testing.assert_array_equal(mixed[t], alone[a][t], f"layer {layer} token {t} ({a})")
            self.assertFalse(np.array_equal(alone["a1"], alone[None]), "a1 changes nothing")
        # a2 has no factors on layer 0: its tokens there are the base model's
        np.testing.assert_array_equal(self.c.forward(0, x, adapters="a2"), self.c.forward(0, x))

    def test_uniform_lists(self):
        """A list naming one adapter (or none) for every token is the
        single-name forward."""
        x = xs(5)
        y, meta = self.c.forward(1, x, adapters=["a1"] * 5, return_meta=True)
        np.testing.assert_array_equal(y, self.c.forward(1, x, adapters="a1"))
        self.assertEqual([a["name"] for a in meta["adapters"]], ["a1"])
        np.testing.assert_array_equal(self.c.forward(1, x, adapters=[None] * 5), self.c.forward(1, x))


class TestConnections(Base):
    def test_keep_alive(self):
        """Every kind of call, a refused upload among them, on one TCP
        connection."""
        c = Client(self.server.url)
        x = xs(2)
        for _ in range(5):
            c.health()
            c.pool()
            c.adapters()
            c.forward(0, x, adapters="a1")
            c.forward(0, x, adapters=["a1", "a2"])
            c.validate(path="a1")
            with self.assertRaises(LorasinkError):
                c.forward(0, np.zeros((1, H + 1), np.float32))
        self.assertEqual(c.connections_opened, 1)
        c.close()
        c.health()
        self.assertEqual(c.connections_opened, 2)
        c.close()


class TestKeyAndIdle(unittest.TestCase):
    """A server with --api-key that closes idle connections after 1 s."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server(*DEMO, "--api-key", "k3y", "--connection-timeout", "1")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_api_key(self):
        with Client(self.server.url) as c:
            self.assertEqual(c.health()["status"], "ok")  # no key needed
        for key in (None, "wrong"):
            with self.subTest(key=key), Client(self.server.url, api_key=key) as c, \
                    self.assertRaises(LorasinkError) as e:
                c.pool()
            self.assertEqual((e.exception.status, e.exception.code), (401, "unauthorized"))
        with Client(self.server.url, api_key="k3y") as c:
            self.assertEqual(c.pool()["capacity"]["slots"], 4)
            self.assertEqual(c.forward(0, xs(1)).shape, (1, H))

    def test_reconnects_after_idle_close(self):
        with Client(self.server.url, api_key="k3y") as c:
            c.pool()
            sock = c._conn.sock
            # The server closes it after --connection-timeout: wait for the
            # EOF to arrive (bounded), then use the client again.
            self.assertTrue(select.select([sock], [], [], 30)[0], "the server never closed the idle connection")
            self.assertEqual(c.pool()["capacity"]["slots"], 4)
            self.assertEqual(c.connections_opened, 2)

    def test_bodiless_refusal_keeps_connection(self):
        """A 401 to a request with no body keeps its connection."""
        with Client(self.server.url) as c:
            with self.assertRaises(LorasinkError):
                c.pool()
            self.assertEqual(c.health()["status"], "ok")
            self.assertEqual(c.connections_opened, 1)

    def test_reconnects_after_connection_close(self):
        """A 401 to a request with a body it never read closes the
        connection; the next call opens another."""
        with Client(self.server.url) as c:
            with self.assertRaises(LorasinkError) as e:
                c.forward(0, xs(1))
            self.assertEqual(e.exception.status, 401)
            self.assertEqual(c.health()["status"], "ok")
            self.assertEqual(c.connections_opened, 2)


class TestLargeBodies(unittest.TestCase):
    """A body past the socket buffers that the server refuses from its
    head: its answer came back as connection_error (BrokenPipeError) and
    the body was sent twice. It now asks first (Expect: 100-continue)."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server(*DEMO, "--max-body-mb", "2", "--api-key", "k")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_refused_from_the_head(self):
        with Client(self.server.url, api_key="k") as c:
            with self.assertRaises(LorasinkError) as e:
                c.forward(0, xs(20000))  # 5 MiB
            self.assertEqual((e.exception.status, e.exception.code), (413, "payload_too_large"), str(e.exception))
            self.assertEqual(c.health()["status"], "ok")  # the next call opens another connection
        with Client(self.server.url, api_key="wrong") as c:
            with self.assertRaises(LorasinkError) as e:
                c.forward(0, xs(9000))  # 2.2 MiB, past the limit too: the key is refused first
            self.assertEqual((e.exception.status, e.exception.code), (401, "unauthorized"), str(e.exception))

    def test_accepted_after_continue(self):
        with Client(self.server.url, api_key="k") as c:
            sent = []
            putheader = c._conn.putheader
            c._conn.putheader = lambda k, *v: (sent.append(k), putheader(k, *v))[1]
            x = xs(4200)  # 1.03 MiB of x: asks first, then sends
            y = c.forward(0, x)
            self.assertIn("Expect", sent)
            self.assertEqual(y.shape, (4200, H))
            np.testing.assert_array_equal(y[:3], c.forward(0, x[:3]))  # a token's bits whatever its batch
            self.assertEqual(c.connections_opened, 1)

    def test_high_fds(self):
        """select() raised ValueError (not LorasinkError) for a socket fd
        past 1023, common in processes with many files open."""
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard < 1200:
            self.skipTest(f"RLIMIT_NOFILE hard limit {hard} < 1200")
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
        try:
            with Client(self.server.url, api_key="k") as c:
                self.assertEqual(c.forward(0, xs(4200)).shape, (4200, H))
                self.assertGreater(c._conn.sock.fileno(), 1023)
                self.assertEqual(c.health()["status"], "ok")  # the idle check on a reused connection
                self.assertEqual(c.connections_opened, 1)
        finally:
            for fd in held:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class TestThreads(Base):
    def test_one_client_shared(self):
        """Threads sharing one Client got each other's answers (wrong y,
        no error); they now take turns."""
        inputs = [xs(1 + i % 5) for i in range(40)]
        want = [self.c.forward(0, x, adapters="a1") for x in inputs]
        shared = Client(self.server.url)
        got, errors = [None] * len(inputs), []

        def run(k):
            try:
                for i in range(k, len(inputs), 8):
                    got[i] = shared.forward(0, inputs[i], adapters="a1")
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        shared.close()
        self.assertEqual(errors, [])
        for i in range(len(inputs)):
            np.testing.assert_array_equal(got[i], want[i])


class TestWaitReady(unittest.TestCase):
    def test_bounded_by_its_own_timeout(self):
        """A server that accepts and never answers held wait_ready for the
        client's timeout (30 s here), not its own."""
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()  # the kernel completes handshakes; nothing ever answers
        import time
        t0 = time.monotonic()
        with Client("http://127.0.0.1:%d" % s.getsockname()[1], timeout=30) as c:
            with self.assertRaises(LorasinkError) as e:
                c.wait_ready(timeout=1)
        self.assertEqual(e.exception.code, "connection_error")
        self.assertLess(time.monotonic() - t0, 10)
        s.close()


class TestErrorObject(unittest.TestCase):
    def test_pickles(self):
        e = LorasinkError(409, "adapter_exists", "m", "h", [{"code": "x"}], 2, 1, "rid")
        back = pickle.loads(pickle.dumps(e))
        self.assertEqual((back.status, back.code, back.message, back.hint, back.violations, back.violations_dropped,
                          back.retry_after, back.request_id, str(back)),
                         (409, "adapter_exists", "m", "h", [{"code": "x"}], 2, 1, "rid", str(e)))

    def test_retry_after(self):
        from lorasink.client import _retry_after
        self.assertEqual([_retry_after(v) for v in ("1", "1.5", "0", None, "Wed, 21 Oct 2026 07:28:00 GMT", "-1")],
                         [1, 2, 0, None, None, None])


class _Stub:
    """An HTTP stub on an ephemeral port: each connection is handed to
    handle(conn, f), f reading it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as f:
                self.handle(conn, f)

    @staticmethod
    def read_request(f):
        """Reads one request's head and body; False at the connection's end."""
        length, line = 0, f.readline()
        while line not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
            line = f.readline()
        if line != b"\r\n":
            return False
        f.read(length)
        return True

    def close(self):
        self.sock.close()


class StubServer(_Stub):
    """Answers every request with one fixed answer (a proxy's or a captive
    portal's page)."""

    def __init__(self, answer):
        self.answer = answer
        super().__init__()

    def handle(self, conn, f):
        while self.read_request(f):
            conn.sendall(self.answer)


class TestNotLorasink(unittest.TestCase):
    def test_a_200_that_is_not_ours(self):
        """A 200 HTML page raised JSONDecodeError, and one that is not
        safetensors ValueError: both are LorasinkError http_error now."""
        page = b"<html>sign in</html>"
        stub = StubServer(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s"
                          % (len(page), page))
        with Client(stub.url, timeout=10) as c:
            for call in (c.health, c.adapters, lambda: c.forward(0, xs(1))):
                with self.assertRaises(LorasinkError) as e:
                    call()
                self.assertEqual((e.exception.status, e.exception.code), (200, "http_error"))
                self.assertIn("sign in", e.exception.message)
        stub.close()


class DroppingServer(_Stub):
    """Each connection answers `answers` requests, then reads one more and
    closes without answering (a keep-alive closed by the server just as
    the client reused it)."""

    def __init__(self, answers):
        self.answers, self.requests = answers, 0
        super().__init__()

    def handle(self, conn, f):
        for i in range(self.answers + 1):
            if not self.read_request(f):
                break
            self.requests += 1
            if i == self.answers:
                break  # read, never answered
            body = b'{"status":"ok"}\n'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))


class TestRetry(unittest.TestCase):
    def test_retried_once_on_a_reused_connection(self):
        stub = DroppingServer(answers=1)
        c = Client(stub.url, timeout=10)
        c.health()
        self.assertEqual(c.health(), {"status": "ok"})  # dropped, sent again on a new connection
        self.assertEqual((c.connections_opened, stub.requests), (2, 3))
        c.close()
        stub.close()

    def test_not_retried_on_a_new_connection(self):
        stub = DroppingServer(answers=0)
        c = Client(stub.url, timeout=10)
        with self.assertRaises(LorasinkError) as e:
            c.health()
        self.assertEqual(e.exception.code, "connection_error")
        self.assertEqual((c.connections_opened, stub.requests), (1, 1))
        c.close()
        stub.close()


class TestCodec(unittest.TestCase):
    """The client's safetensors codec against the safetensors library."""

    def test_round_trips(self):
        from safetensors.numpy import load, save

        t = {"x": rng.standard_normal((3, 5), dtype=np.float32), "g": np.arange(6, dtype=np.float16).reshape(2, 3)}
        got = load(_tensors.st_encode({k: _tensors.to_wire(v, k) for k, v in t.items()}, {"a": "1"}))
        for k in t:
            np.testing.assert_array_equal(got[k], t[k])
        wires, meta = _tensors.st_decode(save(t, metadata={"layer": "3"}))
        self.assertEqual(meta, {"layer": "3"})
        for k in t:
            np.testing.assert_array_equal(_tensors.wire_to_numpy(wires[k]), t[k].astype(np.float32))

    def test_bf16_bits(self):
        w = _tensors.Wire("BF16", (2,), np.array([0x3F80, 0xC040], "<u2").tobytes())
        np.testing.assert_array_equal(_tensors.wire_to_numpy(w), np.array([1.0, -3.0], np.float32))

    def test_damaged(self):
        good = _tensors.st_encode({"y": _tensors.to_wire(np.ones((2, 2), np.float32), "y")})
        for bad in (good[:5], good[:-1], good + b"\0", b"\xff" * 8 + good[8:]):
            with self.assertRaises(ValueError):
                _tensors.st_decode(bad)


@unittest.skipUnless(os.environ.get("LORASINK_EXPECT_PACKAGED") == "1", "run by scripts/check-python.sh")
class TestPackaging(unittest.TestCase):
    def test_installed_without_torch(self):
        """The check installs the package into a venv without torch: the
        tests above ran on the installed copy, numpy only."""
        src = os.path.join(os.path.dirname(__file__), "..", "src")
        self.assertFalse(os.path.abspath(lorasink.__file__).startswith(os.path.abspath(src)), lorasink.__file__)
        self.assertIsNone(importlib.util.find_spec("torch"))
        self.assertNotIn("torch", sys.modules)


if __name__ == "__main__":
    unittest.main()
