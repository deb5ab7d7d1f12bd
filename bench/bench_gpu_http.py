#!/usr/bin/env python3
"""The HTTP rows of bench_gpu: POST /forward through a running server,
timed from the client, so that bench_gpu can put them beside its
in-process end-to-end forwards (HTTP ms / e2e ms).

It reads the model's sizes from GET /model, uploads ADAPTERS adapters of
rank RANK (PEFT safetensors bodies, names gpubench0..; replaced when
present), then times, on one kept-alive connection (raw socket,
TCP_NODELAY, reply read into one buffer):

- T = 1 and T = 64 on one adapter, safetensors bodies (x F32 [T, H]; the
  adapter in the query);
- T = 64 spread over every adapter (token t on adapter t % ADAPTERS): a
  safetensors body naming each token's adapter in its metadata, and the
  same as a JSON body with x as a base64 object and "encoding": "base64"
  (docs/api.md);
- the same 64 tokens as ADAPTERS concurrent safetensors requests of
  64 / ADAPTERS tokens, one adapter and one connection each, as clients
  serving several adapters send them and the server batches them: the
  time from their common start to the last reply.

Each row: WARMUP untimed requests, then REPS timed ones, first byte sent
to last byte received. Prints one JSON object per line: first
{"url", "backend", "n", "hidden", "intermediate"}, then per row
{"body", "T", "adapters", "ms" (median), "min_ms", "max_ms", "n"}.
Standard library only (tests/system/lsys.py for the safetensors writer
and the upload client, bench/raw_client.py for the timed one).
tests/gpu/check.sh runs it against lorasink --device cuda at the bench
shape; any server works:

    bench/bench_gpu_http.py --url http://127.0.0.1:8080 [--adapters 8] [--rank 16] [--reps 50]
"""
import argparse
import base64
import json
import os
import random
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "system"))
import lsys  # noqa: E402 - the system checks' helper, beside them
from raw_client import RawClient  # noqa: E402 - bench/, this file's own folder


def upload_adapters(url, model, count, rank):
    """Registers count PEFT adapters of rank `rank` on the model's first
    served layer; returns their names."""
    n, H, F, layer = model["n"], model["hidden"], model["intermediate"], model["layers"][0]
    client = lsys.Client(url, timeout=120)
    names = []
    try:
        for i in range(count):
            rng = random.Random(i)
            tensors = lsys.shared_expert_lora([layer], H, n, F, rank, lambda l, s, r, c: rng.uniform(-0.02, 0.02))
            name = "gpubench%d" % i
            st, out = client.request("POST", "/adapters?name=%s&lora_alpha=%d&replace=true" % (name, rank),
                                     lsys.safetensors_bytes(tensors), {"Content-Type": "application/octet-stream"})
            if st != 201:
                raise SystemExit("bench_gpu_http: upload of %s: %d %s" % (name, st, out[:300]))
            names.append(name)
    finally:
        client.close()
    return names


def x_values(T, H):
    rng = random.Random(T)
    return [rng.uniform(-1, 1) for _ in range(T * H)]


def spread(T, names):
    return [names[t % len(names)] for t in range(T)]


def safetensors_case(T, H, layer, names):
    """One adapter for every token in the query, or (several names) each
    token's, spread over them, in the body's metadata."""
    path, meta = "/forward?layer=%d" % layer, None
    if len(names) == 1:
        path += "&adapter=%s" % names[0]
    else:
        meta = {"adapters": json.dumps(spread(T, names))}
    body = lsys.safetensors_bytes({"x": ((T, H), x_values(T, H))}, meta)
    return path, body, "application/octet-stream", T * H * 4


def json_b64_case(T, H, layer, names):
    x = {"dtype": "f32", "shape": [T, H], "data": base64.b64encode(lsys.f32_bytes(x_values(T, H))).decode()}
    body = json.dumps({"x": x, "layer": layer, "adapters": spread(T, names),
                       "encoding": "base64"}).encode()
    return "/forward", body, "application/json", len(names)


def check_reply(status, reply, ctype, want):
    """Raises unless the reply is a 200 carrying y (safetensors: at least
    `want` bytes; JSON: base64 y and `want` distinct adapters)."""
    if status != 200:
        raise SystemExit("bench_gpu_http: forward: %d %s" % (status, bytes(reply[:300])))
    if ctype == "application/octet-stream":
        if len(reply) < want:
            raise SystemExit("bench_gpu_http: a %d-byte reply, expected at least %d" % (len(reply), want))
        return
    j = json.loads(bytes(reply))
    if not isinstance(j.get("y"), dict) or len(j.get("adapters", [])) != want:
        raise SystemExit("bench_gpu_http: unexpected reply %s" % bytes(reply[:300]))


def emit(body, T, A, times):
    print(json.dumps({"body": body, "T": T, "adapters": A, "ms": statistics.median(times),
                      "min_ms": min(times), "max_ms": max(times), "n": len(times)}), flush=True)


def time_case(client, case, warmup, reps):
    path, body, ctype, want = case
    times = []
    for i in range(warmup + reps):
        status, reply, seconds = client.request(path, body, ctype)
        check_reply(status, reply, ctype, want)
        if i >= warmup:
            times.append(seconds * 1e3)
    return times


def time_concurrent(url, cases, warmup, reps):
    """cases sent at once, one connection and one thread each, warmup +
    reps times: the ms from their common start to the last reply."""
    k = len(cases)
    clients = [RawClient(url, case[3]) for case in cases]
    start, done = threading.Barrier(k + 1, timeout=120), threading.Barrier(k + 1, timeout=120)
    errors = []

    def worker(client, case):
        path, body, ctype, want = case
        try:
            for _ in range(warmup + reps):
                start.wait()
                status, reply, _ = client.request(path, body, ctype)
                check_reply(status, reply, ctype, want)
                done.wait()
        except (Exception, SystemExit) as e:  # any failure ends the row and unblocks the others
            errors.append(e)
            start.abort()
            done.abort()

    threads = [threading.Thread(target=worker, args=(c, case)) for c, case in zip(clients, cases)]
    for t in threads:
        t.start()
    times = []
    try:
        for i in range(warmup + reps):
            start.wait()
            t0 = time.perf_counter()
            done.wait()
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e3)
    except threading.BrokenBarrierError:
        pass
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    if errors:
        raise SystemExit("bench_gpu_http: a concurrent request failed: %s" % errors[0])
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="a running lorasink, e.g. http://127.0.0.1:8080")
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--tokens", default="1,64", help="T of the one-adapter rows; the spread row is the largest")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    st, out = lsys.fetch(a.url, "/model")
    if st != 200:
        raise SystemExit("bench_gpu_http: GET /model: %d %s" % (st, out[:300]))
    model = json.loads(out)
    st, out = lsys.fetch(a.url, "/ready")
    backend = json.loads(out).get("backend") if st == 200 else None
    print(json.dumps({"url": a.url, "backend": backend, "n": model["n"], "hidden": model["hidden"],
                      "intermediate": model["intermediate"]}), flush=True)
    names = upload_adapters(a.url, model, a.adapters, a.rank)
    H, layer = model["hidden"], model["layers"][0]
    tokens = [int(t) for t in a.tokens.split(",")]
    cases = [("safetensors", T, 1, safetensors_case(T, H, layer, names[:1])) for T in tokens]
    cases.append(("safetensors, mixed", max(tokens), len(names), safetensors_case(max(tokens), H, layer, names)))
    cases.append(("json-base64", max(tokens), len(names), json_b64_case(max(tokens), H, layer, names)))
    client = RawClient(a.url, 2 * max(tokens) * H * 4)  # base64 JSON y is 4/3 of the bytes
    try:
        for body, T, A, case in cases:
            emit(body, T, A, time_case(client, case, a.warmup, a.reps))
    finally:
        client.close()
    T = max(tokens)
    if T % len(names) == 0:
        per = [safetensors_case(T // len(names), H, layer, [name]) for name in names]
        emit("safetensors, %d conns" % len(names), T, len(names), time_concurrent(a.url, per, a.warmup, a.reps))


if __name__ == "__main__":
    main()
