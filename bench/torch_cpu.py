#!/usr/bin/env python3
"""The lorasink forward (docs/math.md) in PyTorch on the CPU, in fp32 or
with bf16 tensors (--dtype bfloat16: weights, factors and inputs made
bf16 as a user serving in bf16 writes it; PyTorch's CPU kernels (oneDNN)
accumulate in fp32), written as a user would: the base GEMMs for all tokens, then the LoRA per adapter
group. Same shapes and token mix as bench_cpu; prints one JSON line per
configuration: {"T", "adapters", "ms"} (median), after one line
{"torch": version, "dtype": dtype}; and per T one line {"T", "gemms_ms"}:
the block's two base GEMMs alone (x @ W13^T and a @ W2^T, every expert in
one call), which is what PyTorch's GEMM library (oneDNN for bf16) does at
its best, with no LoRA, SiLU or indexing around it. Install PyTorch with `apt-get install python3-torch`
(Debian 12) and run with /usr/bin/python3, or into a venv from PyPI.
"""
import argparse
import json
import sys
import time

try:
    import torch
except ImportError:
    print("skipped: PyTorch is not installed (apt-get install python3-torch)")
    sys.exit(0)


def median_ms(fn):
    fn()
    times, start = [], time.perf_counter()
    while len(times) < 64 and (len(times) < 3 or time.perf_counter() - start < 0.6):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dt = getattr(torch, a.dtype)
    print(json.dumps({"torch": torch.__version__, "dtype": a.dtype}), flush=True)
    H, F, n, r, S = a.hidden, a.intermediate, a.experts, a.rank, 8
    g = torch.Generator().manual_seed(0)
    w13 = torch.randn(n, 2 * F, H, generator=g) / H ** 0.5   # interleaved rows
    w2 = torch.randn(n, H, F, generator=g) / F ** 0.5
    A_gu = torch.randn(S, 2 * r, H, generator=g) * 0.05       # shared outer factors
    B_gu = torch.randn(S, n, 2 * F, r, generator=g) * 0.05
    A_d = torch.randn(S, n, r, F, generator=g) * 0.05
    B_d = torch.randn(S, H, r, generator=g) * 0.05
    w13, w2, A_gu, B_gu, A_d, B_d = (t.to(dt) for t in (w13, w2, A_gu, B_gu, A_d, B_d))
    w13_all = w13.reshape(n * 2 * F, H)

    def forward(x, gam, slot):
        z = (x @ w13_all.T).view(-1, n, F, 2)           # interleaved: gate j, up j
        gate, up = z[..., 0].clone(), z[..., 1].clone()  # [T, n, F]
        for s in slot.unique().tolist():                 # LoRA per adapter group
            idx = (slot == s).nonzero(as_tuple=True)[0]
            xs = x[idx]
            sh = xs @ A_gu[s].T                           # [Tg, 2r]
            gate[idx] += torch.einsum("tk,efk->tef", sh[:, :r], B_gu[s, :, :F])
            up[idx] += torch.einsum("tk,efk->tef", sh[:, r:], B_gu[s, :, F:])
        act = gam.unsqueeze(-1) * torch.nn.functional.silu(gate) * up  # [T, n, F]
        y = torch.einsum("tef,ehf->th", act, w2)
        for s in slot.unique().tolist():
            idx = (slot == s).nonzero(as_tuple=True)[0]
            d = torch.einsum("tef,erf->tr", act[idx], A_d[s])
            y[idx] += d @ B_d[s].T
        return y

    w2_all = w2.permute(1, 0, 2).reshape(H, n * F)  # y = a[T, n*F] @ w2_all.T

    with torch.no_grad():
        for T in (1, 16, 256, 2048):
            x = torch.randn(T, H, generator=g).to(dt)
            act = torch.randn(T, n * F, generator=g).to(dt)
            ms = median_ms(lambda: (x @ w13_all.T, act @ w2_all.T))
            print(json.dumps({"T": T, "gemms_ms": round(ms, 4)}), flush=True)
            for A in (1, 8):
                if A > T:
                    continue
                x = torch.randn(T, H, generator=g).to(dt)
                gam = torch.rand(T, n, generator=g).to(dt)
                slot = torch.arange(T) % A
                ms = median_ms(lambda: forward(x, gam, slot))
                print(json.dumps({"T": T, "adapters": A, "ms": round(ms, 4)}), flush=True)


if __name__ == "__main__":
    main()
