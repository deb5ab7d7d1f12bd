#!/usr/bin/env python3
"""Soak run (not CI): thousands of load / replace / forward / delete cycles
against one server, with its resident memory sampled as it goes.

    python3 bench/soak.py [--build build] [--cycles 3000] [--state-dir]

Starts build/lorasink on a small demo model (--hidden 512, --intermediate
256, 2 layers, 4 slots, host tier of 8) with an adapter directory and,
with --state-dir, a state directory. Each cycle: loads or replaces one of
32 names (inline uploads and files on disk, so evictions, host-tier drops
and reloads never stop), runs a forward over a mix of 4 adapters and the
base model, and every fourth cycle deletes a name. Every answer must be
the one expected (201, 200, 204/200 for deletes); the run stops at the
first that is not. Prints VmRSS every 250 cycles and a summary: RSS at
start, at the end, the peak, and the growth per 1000 cycles over the
second half of the run (after warm-up). Only the standard library."""
import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "system"))
import lsys  # noqa: E402 - the system checks' helper, beside them

N_EXP, HID, INTER, LAYERS, RANK = 2, 512, 256, 2, 8


def peft_safetensors(seed):
    """A PEFT adapter for the demo model as safetensors bytes."""
    rng = random.Random(seed)
    tensors = lsys.shared_expert_lora(range(LAYERS), HID, N_EXP, INTER, RANK, lambda l, s, i, j: rng.uniform(-0.02, 0.02))
    return lsys.safetensors_bytes(tensors)


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--state-dir", action="store_true", help="run with --state-dir (every change fsynced)")
    args = ap.parse_args()
    binary = os.path.join(args.build, "lorasink")
    if not os.access(binary, os.X_OK):
        sys.exit("soak: build first (bash scripts/build.sh %s)" % args.build)
    tmp = tempfile.mkdtemp(prefix="lorasink-soak-")
    adapters = [peft_safetensors(s) for s in range(8)]
    for i in range(8):
        with open(os.path.join(tmp, "file%d.safetensors" % i), "wb") as f:
            f.write(adapters[i])
    cmd = [binary, "--demo", "--port", "0", "--experts", str(N_EXP), "--hidden", str(HID), "--intermediate",
           str(INTER), "--layers", str(LAYERS), "--slots", "4", "--max-rank", str(RANK), "--host-cache", "8",
           "--adapter-dir", tmp, "--log-level", "warn"]
    if args.state_dir:
        cmd += ["--state-dir", os.path.join(tmp, "state")]
    srv = lsys.Server(binary, cmd[1:], os.path.join(tmp, "server.log"))
    try:
        srv.start(timeout=20)
    except lsys.ServerError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit("soak: the server did not start: %s" % e)
    client = lsys.Client(srv.url, timeout=60)

    def request(method, path, body=None, ctype="application/json"):
        return client.request(method, path, body, {"Content-Type": ctype} if body is not None else {})

    rng = random.Random(1)
    names = ["s%d" % i for i in range(32)]
    registered = set()
    x = json.dumps([[rng.uniform(-1, 1) for _ in range(HID)] for _ in range(5)])
    samples, t0, counts = [], time.time(), {"load": 0, "replace": 0, "forward": 0, "delete": 0}
    failure = None
    try:
        for cycle in range(args.cycles):
            name = rng.choice(names)
            replace = name in registered
            if rng.random() < 0.5:
                body = json.dumps({"name": name, "path": "file%d.safetensors" % rng.randrange(8), "replace": replace,
                                   "config": {"r": RANK, "lora_alpha": 16}}).encode()
                st, out = request("POST", "/adapters", body)
            else:
                st, out = request("POST", "/adapters?name=%s&lora_alpha=16&replace=%s" %
                                  (name, "true" if replace else "false"), adapters[rng.randrange(8)],
                                  "application/octet-stream")
            if st != 201:
                failure = "load %s: %d %s" % (name, st, out[:300])
                break
            registered.add(name)
            counts["replace" if replace else "load"] += 1
            mix = rng.sample(sorted(registered), min(4, len(registered))) + [None]
            mix = (mix * 5)[:5]  # one per token of x
            fwd = '{"x": %s, "adapters": %s}' % (x, json.dumps(mix))
            st, out = request("POST", "/forward", fwd.encode())
            if st != 200:
                failure = "forward %s: %d %s" % (mix, st, out[:300])
                break
            counts["forward"] += 1
            if cycle % 4 == 3:
                victim = rng.choice(sorted(registered))
                st, out = request("DELETE", "/adapters/" + victim)
                if st not in (200, 204):
                    failure = "delete %s: %d %s" % (victim, st, out[:300])
                    break
                registered.discard(victim)
                counts["delete"] += 1
            if cycle % 250 == 0 or cycle == args.cycles - 1:
                kib = rss_kib(srv.proc.pid)
                samples.append((cycle, kib))
                print("cycle %5d  rss %7.1f MiB  %.1f s" % (cycle, kib / 1024, time.time() - t0), flush=True)
    finally:
        client.close()
        rc = srv.stop(timeout=60)
        tail = lsys.log_tail(srv.log_path, 30)[-2000:]
        shutil.rmtree(tmp, ignore_errors=True)
    if failure:
        sys.exit("soak: FAILED at a wrong answer: %s\nserver log tail:\n%s" % (failure, tail))
    if rc != 0:
        sys.exit("soak: the server exited with %d on SIGTERM\n%s" % (rc, tail))
    half = [s for s in samples if s[0] >= args.cycles // 2]
    slope = 0.0
    if len(half) >= 2 and half[-1][0] > half[0][0]:
        slope = (half[-1][1] - half[0][1]) / 1024 / ((half[-1][0] - half[0][0]) / 1000)
    print("soak: %d cycles in %.1f s (%d loads, %d replaces, %d forwards, %d deletes)%s" %
          (args.cycles, time.time() - t0, counts["load"], counts["replace"], counts["forward"], counts["delete"],
           ", --state-dir" if args.state_dir else ""))
    print("soak: rss start %.1f MiB, end %.1f MiB, peak %.1f MiB; second half %+.2f MiB per 1000 cycles" %
          (samples[0][1] / 1024, samples[-1][1] / 1024, max(s[1] for s in samples) / 1024, slope))


if __name__ == "__main__":
    main()
