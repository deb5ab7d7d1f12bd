#!/usr/bin/env python3
"""PyTorch version of the lorasink forward (docs/math.md), timed on the
same GPU and shapes as bench_gpu so the benchmark can print our/their
ratios, in two variants a serious user would write:

- eager: the forward as plain PyTorch calls;
- graph: the same calls captured once in a CUDA graph
  (torch.cuda.CUDAGraph on static input and output tensors, warmed up on
  a side stream first, as PyTorch's CUDA-graph docs say) and replayed;
  the time is the replay alone, inputs already in the static tensors, as
  bench_gpu's device-only time is.

bf16 weights, interleaved W13, shared LoRA pool; tokens grouped by adapter
before timing (in torch's favour). Prints one JSON object per line:
{"variant": "eager"|"graph", "rank", "T", "adapters" (0 = base only), "ms"}
after a first line naming the device.

--dry-run runs tiny shapes on the CPU without timing or capture (every
path but the capture itself: the static tensors, the warm-up, the copy
out), checks the two variants agree, and prints the same lines without
"ms": a syntax and shape check for machines without a GPU. PyTorch is not
a CI dependency; this file is run by tests/gpu/check.sh on the device.
"""
import argparse
import json

import torch


def median_ms(fn, iters):
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


class Model:
    def __init__(self, n, H, F, R, S, gen, dev):
        bf = torch.bfloat16

        def rnd(*shape, scale):
            return ((torch.rand(*shape, generator=gen, device=dev) * 2 - 1) * scale).to(bf)

        self.n, self.H, self.F, self.R = n, H, F, R
        self.w13 = rnd(n * 2 * F, H, scale=(3.0 / H) ** 0.5)  # interleaved rows
        self.w2cat = rnd(H, n * F, scale=(3.0 / (n * F)) ** 0.5)  # [H, n*F]
        self.gu_a = rnd(S, 2 * R, H, scale=(3.0 / H) ** 0.5)
        self.b_gate = rnd(S, n, F, R, scale=0.1)
        self.b_up = rnd(S, n, F, R, scale=0.1)
        self.ad_cat = rnd(S, R, n * F, scale=(3.0 / F) ** 0.5)
        self.bd = rnd(S, H, R, scale=0.1)

    def forward(self, x, gam, groups):
        n, F, R = self.n, self.F, self.R
        T = x.shape[0]
        xb = x.to(torch.bfloat16)
        z = xb @ self.w13.t()
        zv = z.view(T, n, F, 2)
        for s, idx in groups:
            v = xb[idx] @ self.gu_a[s].t()
            zv[idx, :, :, 0] += torch.einsum("tr,efr->tef", v[:, :R], self.b_gate[s])
            zv[idx, :, :, 1] += torch.einsum("tr,efr->tef", v[:, R:], self.b_up[s])
        g = zv[..., 0].float()
        u = zv[..., 1].float()
        a = (gam[:, :, None] * torch.nn.functional.silu(g) * u).to(torch.bfloat16).reshape(T, n * F)
        y = (a @ self.w2cat.t()).float()
        for s, idx in groups:
            w = a[idx] @ self.ad_cat[s].t()
            y[idx] += (w @ self.bd[s].t()).float()
        return y


class Graphed:
    """model.forward(x, gam, groups) on static copies of x and gam,
    captured in a CUDA graph (capture=False, for --dry-run: the same
    static tensors and warm-up, the forward run directly). replay() runs
    it on whatever the static inputs hold; its output is self.y."""

    def __init__(self, model, x, gam, groups, capture=True):
        self.x, self.gam = x.clone(), gam.clone()
        self.fn = lambda: model.forward(self.x, self.gam, groups)
        self.graph = None
        if not capture:
            self.y = self.fn()
            return
        # Warm-up on a side stream, so that lazy initialisation (cuBLAS
        # handles and workspaces) happens outside the capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.y = self.fn()

    def replay(self):
        if self.graph is None:
            self.y.copy_(self.fn())
        else:
            self.graph.replay()


def cases(T, S):
    """Adapter counts of one T: 1, 4 and min(T, S), each once, not past T."""
    out = []
    for A in (1, 4, min(T, S)):
        if A <= T and A not in out:
            out.append(A)
    return out


def groups_of(T, A, dev):
    slot = torch.arange(T, device=dev) % A
    return [(s, (slot == s).nonzero().flatten()) for s in range(A)]


def emit(variant, R, T, A, ms):
    row = {"variant": variant, "rank": R, "T": T, "adapters": A}
    if ms is not None:
        row["ms"] = ms
    print(json.dumps(row), flush=True)


def run_case(model, variants, R, T, A, x, gam, groups, iters, dry):
    """Times (or, dry, checks) one case in each variant."""
    if "eager" in variants:
        if dry:
            y = model.forward(x, gam, groups)
            if y.shape != (T, model.H) or not torch.isfinite(y).all():
                raise SystemExit("torch_ref: dry run: eager y is %s or not finite at R=%d T=%d A=%d"
                                 % (tuple(y.shape), R, T, A))
            emit("eager", R, T, A, None)
        else:
            emit("eager", R, T, A, median_ms(lambda: model.forward(x, gam, groups), iters))
    if "graph" in variants:
        try:
            g = Graphed(model, x, gam, groups, capture=not dry)
        except RuntimeError as e:
            # One case PyTorch cannot capture leaves the others' rows.
            print(json.dumps({"variant": "graph", "rank": R, "T": T, "adapters": A, "error": str(e)[:300]}),
                  flush=True)
            return
        if dry:
            g.replay()
            want = model.forward(x, gam, groups)
            if g.y.shape != (T, model.H) or not torch.isfinite(g.y).all() or not torch.equal(g.y, want):
                raise SystemExit("torch_ref: dry run: the graph path differs from eager at R=%d T=%d A=%d" % (R, T, A))
            emit("graph", R, T, A, None)
        else:
            emit("graph", R, T, A, median_ms(g.replay, iters))
        del g  # frees the graph's private memory pool before the next case


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--ranks", default="16,64")
    ap.add_argument("--tokens", default="1,8,64,512,4096")
    ap.add_argument("--variants", default="eager,graph", help="comma list of eager and graph")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes on the CPU, no timing, no capture: a syntax and shape check")
    args = ap.parse_args()
    variants = args.variants.split(",")
    if args.dry_run:
        n, H, F, S, dev = 2, 64, 32, 4, "cpu"
        ranks, tokens = [4], [1, 8]
        print(json.dumps({"device": "cpu (dry run)", "torch": torch.__version__}), flush=True)
    else:
        n, H, F, S, dev = args.experts, args.hidden, args.intermediate, args.slots, "cuda"
        ranks = [int(r) for r in args.ranks.split(",")]
        tokens = [int(t) for t in args.tokens.split(",")]
        print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    gen = torch.Generator(device=dev)
    gen.manual_seed(42)
    with torch.no_grad():
        for R in ranks:
            model = Model(n, H, F, R, S, gen, dev)
            for T in tokens:
                iters = 200 if T <= 64 else 50 if T <= 512 else 20
                x = torch.rand(T, H, generator=gen, device=dev) * 2 - 1
                gam = torch.rand(T, n, generator=gen, device=dev) * 2
                run_case(model, variants, R, T, 0, x, gam, [], iters, args.dry_run)
                for A in cases(T, S):
                    run_case(model, variants, R, T, A, x, gam, groups_of(T, A, dev), iters, args.dry_run)
            model = None  # frees the slot tensors before the next rank
            if not args.dry_run:
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
