"""What a Unix domain socket would save over loopback TCP for one hop:
the round trip of a request-sized message and a reply-sized one between
two processes, over 127.0.0.1 TCP (TCP_NODELAY) and over AF_UNIX, with
nothing else (no HTTP, no server work). Prints median and p99 in µs;
never fails on time. numpy only.

    python clients/python/bench/socket_rtt.py [--n 5000] [--request 400] [--reply 400]
"""
import argparse
import multiprocessing
import os
import socket
import tempfile
import time

import numpy as np


def recv_exact(conn, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def echo(listener, request, reply):
    conn, _ = listener.accept()
    if conn.family == socket.AF_INET:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = b"y" * reply
    while recv_exact(conn, request) is not None:
        conn.sendall(out)


def rtt(family, address, n, request, reply):
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(1)
    proc = multiprocessing.Process(target=echo, args=(listener, request, reply))
    proc.start()
    c = socket.socket(family, socket.SOCK_STREAM)
    c.connect(listener.getsockname())
    if family == socket.AF_INET:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg, out = b"x" * request, []
    for i in range(n + 200):
        t0 = time.perf_counter()
        c.sendall(msg)
        recv_exact(c, reply)
        if i >= 200:  # warm-up
            out.append((time.perf_counter() - t0) * 1e6)
    c.close()
    proc.join()
    listener.close()
    s = np.sort(out)
    return np.median(s), s[int(0.99 * len(s)) - 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--request", type=int, default=400, help="bytes sent (a T=1, H=32 forward's body and head)")
    ap.add_argument("--reply", type=int, default=400, help="bytes answered")
    args = ap.parse_args()
    multiprocessing.set_start_method("fork")
    path = os.path.join(tempfile.mkdtemp(), "s")
    for name, fam, addr in (("TCP 127.0.0.1", socket.AF_INET, ("127.0.0.1", 0)), ("AF_UNIX", socket.AF_UNIX, path)):
        med, p99 = rtt(fam, addr, args.n, args.request, args.reply)
        print(f"{name}: {args.request} B out, {args.reply} B back: median {med:.0f} µs, p99 {p99:.0f} µs "
              f"({args.n} round trips)")
    os.unlink(path)


if __name__ == "__main__":
    main()
