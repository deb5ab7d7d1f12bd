"""The latency of one layer's hop to lorasink, as an engine in Python sees
it: median and p99 of RemoteSharedExperts (torch in, torch out) and of
Client.forward (numpy, a safetensors body: one adapter in the query,
mixed adapters per token in the body's metadata), for T=1 and T=128
tokens, at the tiny DeepSeek-V3 checkpoint of the tests (H=32) and at
H=2048 (the demo model with one shared expert of F=2816,
DeepSeek-V2-Lite's 2 x 1408, bf16 weights).
Beside them: GET /health on the same connection (the HTTP round trip
alone) and the server's own time per forward from its access log. Prints
a Markdown table for docs/perf.md; never fails on time.

    LORASINK_BIN=build/lorasink PYTHONPATH=clients/python/src \\
        ~/.cache/lorasink/venv-hf/bin/python clients/python/bench/hop_latency.py [--n 1000]
"""
import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from _server import ROOT, Server, peft_tensors  # noqa: E402
from test_torch import deepseek  # noqa: E402

from lorasink import Client  # noqa: E402
from lorasink.torch import RemoteSharedExperts  # noqa: E402


def stats(samples_us):
    s = np.sort(np.asarray(samples_us))
    return np.median(s), s[min(len(s) - 1, int(np.ceil(0.99 * len(s))) - 1)]


def timed(fn, n, warm=20):
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def server_us(server, since):
    """The access log's microseconds of the forwards logged after line
    number since."""
    lines = server.logtext().splitlines()[since:]
    return [int(l.split()[-1]) for l in lines if " POST /forward" in l and l.split()[-3] == "200"]


def measure(label, server, client, layer, H, n, rows):
    mixed = ["a", None]
    mod = RemoteSharedExperts(client, layer, "a")
    for T in (1, 128):
        x = torch.randn(T, H)
        xn = x.numpy()
        reps = n if T == 1 or H < 1024 else max(50, n // 5)
        cases = [("GET /health (HTTP alone)", lambda: client.health(), False),
                 ("RemoteSharedExperts, torch", lambda: mod(x), True),
                 ("Client.forward, numpy, one adapter", lambda: client.forward(layer, xn, adapters="a"), True)]
        if T > 1:
            names = [mixed[t % 2] for t in range(T)]
            cases.append(("Client.forward, numpy, mixed adapters",
                          lambda: client.forward(layer, xn, adapters=names), True))
        for what, fn, fwd in cases:
            since = len(server.logtext().splitlines())
            med, p99 = stats(timed(fn, reps))
            srv = f"{np.median(server_us(server, since)):.0f}" if fwd else "–"
            rows.append(f"| {label} | {T} | {what} | {med:.0f} | {p99:.0f} | {srv} | {reps} |")
            print(rows[-1], flush=True)


def tiny(work, n, rows):
    torch.manual_seed(1)
    model = deepseek()
    ckpt = os.path.join(work, "tiny")
    model.save_pretrained(ckpt)
    s = Server("--weights", ckpt, "--max-rank", "8")
    try:
        c = Client(s.url)
        m = c.model()
        c.load("a", tensors=peft_tensors(m["layers"], m["n"], m["hidden"], m["intermediate"], 4, seed=2),
               config={"r": 4, "lora_alpha": 8})
        measure(f"tiny DeepSeek-V3 (H={m['hidden']}, n={m['n']}, F={m['intermediate']})", s, c, m["layers"][0],
                m["hidden"], n, rows)
        c.close()
    finally:
        s.stop()


def large(n, rows):
    H, F = 2048, 2816
    s = Server("--demo", "--experts", "1", "--hidden", str(H), "--intermediate", str(F), "--layers", "1",
               "--max-rank", "16")
    try:
        c = Client(s.url)
        c.load("a", tensors=peft_tensors([0], 1, H, F, 16, seed=3), config={"r": 16, "lora_alpha": 32})
        measure(f"demo, bf16 (H={H}, n=1, F={F})", s, c, 0, H, n, rows)
        c.close()
    finally:
        s.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000, help="samples per case (a fifth at H=2048, T=128)")
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"commit {commit}; {cpu}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
          f"Python {platform.python_version()}, torch {torch.__version__}; CPU backend, 127.0.0.1 TCP")
    rows = ["| model | T | call | median µs | p99 µs | server µs (median) | samples |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    print("\n".join(rows))
    work = tempfile.mkdtemp(prefix="lorasink-hop-")
    try:
        tiny(work, args.n, rows)
        large(args.n, rows)
    finally:
        shutil.rmtree(work)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
