#!/usr/bin/env python3
"""What the HTTP path costs beside compute (issue 27): /forward with
safetensors bodies against the same forward in process, T=16 and
T=2048, the base model and one adapter, --compute f32 and bf16.

The server is the Release build's lorasink, started here on a free port
(--demo --hidden 2048 --intermediate 1024 --experts 2 --layers 1
--threads 2, access log off). The in-process time is bench_forward (the
same build): the server's model, backend and pool made by ls_server_init
from the same command line, timing ls_pool_forward, the call the batcher
makes for a lone request, on buffers allocated once, back to back as
bench_cpu calls it (the first of each block untimed, so the engine's
threads are awake as in a run of calls). Both stay up; each round runs a
block of in-process forwards and a block of HTTP ones back to back (the
order alternating), and the ratio given is the median over rounds of
each round's median over median, with the rounds' range: on shared
cores a neighbour's load falls on both sides of a round.

The client is a raw socket (one kept-alive connection, TCP_NODELAY, the
request head and the body written with sendall, the reply read with
recv_into into a buffer allocated once): http.client's reads copy the
16 MiB reply more than once. Times run from the first byte sent to the
last byte received.

With --python PATH, bench/torch_cpu.py --dtype bfloat16 runs with that
interpreter before, between and after the servers' rounds, and the bf16 one-adapter rows
are also given over PyTorch's (its forward with one rank-16 adapter and
gammas, the adapter here rank 16 too).

    bench/bench_http_cost.py [--build build-release] [--rounds 9] [--python PATH] [--compute f32,bf16]
                             [--tokens 16,2048]
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "system"))
import lsys  # noqa: E402
from raw_client import RawClient  # noqa: E402 - bench/, this file's own folder

H, F, N, RANK = 2048, 1024, 2, 16
SIZES = ((16, 30), (2048, 3))  # (T, forwards a round of each side)


def server_args(compute, adapter_dir):
    return ["--demo", "--hidden", str(H), "--intermediate", str(F), "--experts", str(N), "--layers", "1",
            "--threads", "2", "--compute", compute, "--access-log=false", "--adapter-dir", adapter_dir,
            "--adapter", "a1=a1.safetensors", "--max-rank", str(RANK), "--port", "0"]


def write_adapter(adir):
    def value(layer, s, i, j):
        return ((i * 7 + j * 3 + s) % 13 - 6) / 256.0
    tensors = lsys.shared_expert_lora([0], H, N, F, RANK, value)
    lsys.write_safetensors(os.path.join(adir, "a1.safetensors"), tensors, {"lora_alpha": str(RANK)})


def x_body(T):
    """A safetensors body with x [T, H]: the values bench_forward uses."""
    row = lsys.f32_bytes([((j * 7) % 13 - 6) / 8.0 for j in range(H)])
    data = row * T
    header = json.dumps({"x": {"dtype": "F32", "shape": [T, H], "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def forward(cli, path, body, want_len):
    """The seconds of one safetensors forward; raises unless it is a 200
    carrying at least want_len bytes."""
    status, reply, seconds = cli.request(path, body)
    if status != 200 or len(reply) < want_len:
        raise RuntimeError("%s: %d, %d bytes: %r" % (path, status, len(reply), bytes(reply[:300])))
    return seconds


def _now():
    return time.perf_counter()


class InProcess:
    """bench_forward with the server's command line."""

    def __init__(self, binary, args):
        self.proc = subprocess.Popen([binary] + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError("bench_forward did not start: %r" % line)

    def times(self, T, name, reps):
        """reps timed forwards after one untimed."""
        self.proc.stdin.write("%d %s %d\n" % (T, name or "-", reps + 1))
        self.proc.stdin.flush()
        return [float(v) / 1e3 for v in self.proc.stdout.readline().split()][1:]

    def close(self):
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait()


def torch_bf16(python):
    """{T: ms} of torch_cpu.py's bf16 forward with one adapter."""
    out = subprocess.run([python, os.path.join(HERE, "torch_cpu.py"), "--dtype", "bfloat16", "--rank", str(RANK),
                          "--hidden", str(H), "--intermediate", str(F), "--experts", str(N), "--threads", "2"],
                         capture_output=True, text=True, check=True).stdout
    res = {}
    for line in out.splitlines():
        d = json.loads(line) if line.startswith("{") else {}
        if d.get("adapters") == 1:
            res[d["T"]] = d["ms"] / 1e3
    return res


def server_cost(pid):
    """(minor page faults of the process, ns on the CPU of its HTTP
    threads, libmicrohttpd's "MHD-" ones), from /proc: counts that a
    neighbour's load does not change, as it changes times."""
    with open("/proc/%d/stat" % pid) as f:
        faults = int(f.read().rsplit(")", 1)[1].split()[7])
    ns = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                if not f.read().startswith("MHD-"):
                    continue
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                ns += int(f.read().split()[0])
        except OSError:
            continue
    return faults, ns


def measure(build, compute, adir, rounds, sizes):
    """{(T, name): (http seconds, in-process seconds, per-round ratios,
    [page faults, HTTP threads' ns, requests])}."""
    args = server_args(compute, adir)
    srv = lsys.Server(os.path.join(build, "lorasink"), args, os.path.join(adir, "server-%s.log" % compute)).start()
    inp = InProcess(os.path.join(build, "bench", "bench_forward"), args)
    cli = RawClient("http://127.0.0.1:%d" % srv.port, 64 << 20)
    res = {}
    try:
        bodies = {T: x_body(T) for T, _ in sizes}
        cases = [(T, reps, name) for T, reps in sizes for name in (None, "a1")]
        for T, reps, name in cases:  # warm-up
            forward(cli, "/forward" + ("?adapter=" + name if name else ""), bodies[T], T * H * 4)
            inp.times(T, name, 1)
        for r in range(rounds):
            for T, reps, name in cases:
                path = "/forward" + ("?adapter=" + name if name else "")
                h, p, _, cost = res.setdefault((T, name), ([], [], [], [0, 0, 0]))
                def http_side():
                    c0 = server_cost(srv.proc.pid)
                    out = [forward(cli, path, bodies[T], T * H * 4) for _ in range(reps)]
                    c1 = server_cost(srv.proc.pid)
                    cost[0] += c1[0] - c0[0]
                    cost[1] += c1[1] - c0[1]
                    cost[2] += reps
                    return out
                def inproc_side():
                    return inp.times(T, name, reps)
                first, second = (http_side, inproc_side) if r % 2 == 0 else (inproc_side, http_side)
                a, b = first(), second()
                hs, ps = (a, b) if r % 2 == 0 else (b, a)
                h += hs
                p += ps
                res[(T, name)][2].append(statistics.median(hs) / statistics.median(ps))
    finally:
        inp.close()
        srv.stop()
    return res


def ms(v):
    return "%.2f" % (v * 1e3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build-release"))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--python", help="an interpreter with PyTorch, for the bf16 rows over PyTorch's")
    ap.add_argument("--compute", default="f32,bf16")
    ap.add_argument("--tokens", default="16,2048", help="T of the forwards, from 16 and 2048")
    a = ap.parse_args()
    print("http: client: raw socket, one kept-alive connection, safetensors bodies; in-process: bench_forward "
          "(ls_pool_forward on the server's own pool); %d rounds, each side interleaved" % a.rounds)
    torch_runs = []
    if a.python:
        torch_runs.append(torch_bf16(a.python))
    results = {}
    with tempfile.TemporaryDirectory() as adir:
        write_adapter(adir)
        for k, compute in enumerate(a.compute.split(",")):
            if k and a.python:
                torch_runs.append(torch_bf16(a.python))
            sizes = [(T, reps) for T, reps in SIZES if str(T) in a.tokens.split(",")]
            results[compute] = measure(a.build, compute, adir, a.rounds, sizes)
    if a.python:
        torch_runs.append(torch_bf16(a.python))
    for compute, res in results.items():
        for (T, name), (h, p, ratios, cost) in sorted(res.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            what = "T=%d %s" % (T, "adapter a1" if name else "base")
            print("http: %s %s: over HTTP median %s ms (%s-%s), in-process median %s ms (%s-%s), %d each"
                  % (compute, what, ms(statistics.median(h)), ms(min(h)), ms(max(h)), ms(statistics.median(p)),
                     ms(min(p)), ms(max(p)), len(h)))
            print("http: %s %s over HTTP / in-process = %.3f (rounds %.3f-%.3f)"
                  % (compute, what, statistics.median(ratios), min(ratios), max(ratios)))
            print("http: %s %s: per request %.0f page faults, %.2f ms on the HTTP threads' CPU"
                  % (compute, what, cost[0] / cost[2], cost[1] / cost[2] / 1e6))
            if compute == "bf16" and name:
                if not torch_runs:
                    print("http: bf16 %s over HTTP / PyTorch bf16 in-process: skipped (no --python)" % what)
                else:
                    tt = [run[T] for run in torch_runs if T in run]
                    print("http: bf16 %s over HTTP / PyTorch bf16 in-process = %.3f (PyTorch %s ms, runs %s)"
                          % (what, statistics.median(h) / statistics.median(tt), ms(statistics.median(tt)),
                             ", ".join(ms(t) for t in tt)))


if __name__ == "__main__":
    main()
