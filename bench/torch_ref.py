#!/usr/bin/env python3
"""PyTorch eager version of the lorasink forward (docs/math.md), timed on
the same GPU and shapes as bench_gpu so the benchmark can print our/their
ratios. bf16 weights, interleaved W13, shared LoRA pool; tokens grouped by
adapter before timing (in torch's favour). Prints one JSON object per line:
{"rank", "T", "adapters" (0 = base only), "ms"}.
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
    def __init__(self, n, H, F, R, S, gen):
        dev, bf = "cuda", torch.bfloat16

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


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--experts", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--ranks", default="16,64")
    ap.add_argument("--tokens", default="1,8,64,512,4096")
    args = ap.parse_args()
    n, H, F, S = args.experts, args.hidden, args.intermediate, args.slots
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(42)
    with torch.no_grad():
        for R in [int(r) for r in args.ranks.split(",")]:
            model = Model(n, H, F, R, S, gen)
            for T in [int(t) for t in args.tokens.split(",")]:
                iters = 200 if T <= 64 else 50 if T <= 512 else 20
                x = torch.rand(T, H, generator=gen, device="cuda") * 2 - 1
                gam = torch.rand(T, n, generator=gen, device="cuda") * 2
                ms = median_ms(lambda: model.forward(x, gam, []), iters)
                print(json.dumps({"rank": R, "T": T, "adapters": 0, "ms": ms}), flush=True)
                seen = set()
                for A in (1, 4, min(T, S)):
                    if A > T or A in seen:
                        continue
                    seen.add(A)
                    slot = torch.arange(T, device="cuda") % A
                    groups = [(s, (slot == s).nonzero().flatten()) for s in range(A)]
                    ms = median_ms(lambda: model.forward(x, gam, groups), iters)
                    print(json.dumps({"rank": R, "T": T, "adapters": A, "ms": ms}), flush=True)
            model = None  # frees the slot tensors before the next rank
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
