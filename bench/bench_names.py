#!/usr/bin/env python3
"""Adapter-name bookkeeping of a forward (not CI): the time of a
/forward of --tokens tokens over --adapters adapters, on a demo model small
enough that parsing, resolving and mapping names back weigh beside the
compute, for one build or for two side by side (--baseline: an older
build, to print the ratio of its time to this one's).

    python3 bench/bench_names.py [--build build] [--baseline OLD_BUILD]
                                 [--tokens 2048] [--adapters 8] [--requests 200]

Three bodies: JSON (x and y as base64, so that numbers' text does not
drown the names) with the adapters interleaved token by token (each token
another adapter than the one before), the same with them in runs (the
usual shape: a request's tokens come per sequence), and a safetensors body
routed with ?adapter= (one name for every token). Requests run one at a
time, the builds' servers taking turns. Prints the fastest and the median
time per body and build, and their ratios; never passes or fails on time.
Only the standard library."""
import argparse
import base64
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "system"))
import lsys  # noqa: E402 - the system checks' helper, beside them

N_EXP, HID, INTER, LAYERS, RANK = 2, 16, 8, 1, 4


def peft_safetensors(seed):
    """A PEFT adapter for the demo model as safetensors bytes."""
    rng = random.Random(seed)
    tensors = lsys.shared_expert_lora(range(LAYERS), HID, N_EXP, INTER, RANK, lambda l, s, i, j: rng.uniform(-0.02, 0.02))
    return lsys.safetensors_bytes(tensors)


def bodies(tokens, adapters):
    """(label, path, body bytes, content type) of each body measured."""
    rng = random.Random(7)
    rows = [[rng.uniform(-1, 1) for _ in range(HID)] for _ in range(tokens)]
    names = ["tenant-%d" % i for i in range(adapters)]
    interleaved = [names[t % adapters] for t in range(tokens)]
    runs = [names[t * adapters // tokens] for t in range(tokens)]
    raw = lsys.safetensors_bytes({"x": ((tokens, HID), rows)})
    # x and y as base64, so that the numbers' text does not drown the names.
    x = {"dtype": "f32", "shape": [tokens, HID],
         "data": base64.b64encode(lsys.f32_bytes([v for row in rows for v in row])).decode()}

    def js(names_of_tokens):
        return json.dumps({"x": x, "encoding": "base64", "adapters": names_of_tokens}).encode()
    return names, [
        ("json, interleaved", "/forward", js(interleaved), "application/json"),
        ("json, runs", "/forward", js(runs), "application/json"),
        ("safetensors, ?adapter=", "/forward?adapter=" + names[0], raw, "application/octet-stream"),
    ]


def start(build, names, tokens, tmp):
    """A server of build on the demo model with names loaded, and a client."""
    binary = os.path.join(build, "lorasink")
    if not os.access(binary, os.X_OK):
        sys.exit("bench_names: no server at %s (bash scripts/build.sh %s)" % (binary, build))
    args = ["--demo", "--port", "0", "--experts", str(N_EXP), "--hidden", str(HID), "--intermediate", str(INTER),
            "--layers", str(LAYERS), "--slots", str(len(names)), "--max-rank", str(RANK), "--max-request-tokens",
            str(max(tokens, 16384)), "--max-batch-tokens", str(max(tokens, 8192)), "--log-level", "warn",
            "--access-log=false"]
    srv = lsys.Server(binary, args, tempfile.mktemp(prefix="server-", suffix=".log", dir=tmp))
    srv.start(timeout=30)
    client = lsys.Client(srv.url, timeout=60)
    for i, name in enumerate(names):
        st, out = client.request("POST", "/adapters?name=%s&lora_alpha=8" % name, peft_safetensors(i),
                                 {"Content-Type": "application/octet-stream"})
        if st != 201:
            sys.exit("bench_names: loading %s: %d %s" % (name, st, out[:300]))
    return srv, client


def measure(clients, cases, requests):
    """(fastest, median) seconds per request of each case on each client:
    the servers take turns request by request, so that a busy machine slows
    them alike (the fastest is the least disturbed by it)."""
    medians = [[] for _ in clients]
    for label, path, body, ctype in cases:
        times = [[] for _ in clients]
        for i in range(requests + 5):
            for c, client in enumerate(clients):
                t0 = time.perf_counter()
                st, out = client.request("POST", path, body, {"Content-Type": ctype})
                if st != 200:
                    sys.exit("bench_names: %s: %d %s" % (label, st, out[:300]))
                if i >= 5:  # the first few warm the slots and caches
                    times[c].append(time.perf_counter() - t0)
        for c in range(len(clients)):
            medians[c].append((min(times[c]), statistics.median(times[c])))
    return medians


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--baseline", help="an older build to compare with")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    names, cases = bodies(args.tokens, args.adapters)
    builds = [args.build] + ([args.baseline] if args.baseline else [])
    tmp = tempfile.mkdtemp(prefix="lorasink-bench-names-")
    servers = []
    try:
        for b in builds:
            servers.append(start(b, names, args.tokens, tmp))
        results = dict(zip(builds, measure([c for _, c in servers], cases, args.requests)))
    finally:
        for srv, client in servers:
            client.close()
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("T=%d tokens, %d adapters, H=%d, %d requests each, fastest and median ms:" %
          (args.tokens, args.adapters, HID, args.requests))
    for b in builds:
        for (label, _, _, _), (fast, med) in zip(cases, results[b]):
            print("  %-24s %-28s %8.3f %8.3f" % (label, b, fast * 1e3, med * 1e3))
    if args.baseline:
        for (label, _, _, _), new, old in zip(cases, results[args.build], results[args.baseline]):
            print("ratio %s: %s / %s = %.2fx fastest, %.2fx median" %
                  (label, args.baseline, args.build, old[0] / new[0], old[1] / new[1]))


if __name__ == "__main__":
    main()
