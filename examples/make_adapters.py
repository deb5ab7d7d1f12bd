#!/usr/bin/env python3
"""Makes one LoRA adapter of lorasink's shared experts in every upload form
(docs/adapters.md walks through it), and with --server loads each form into
a running lorasink and checks that they are the same adapter.

The adapter stands for what PEFT writes after training a model whose
shared experts have a fused gate_up_proj and a down_proj (target_modules
["gate_up_proj", "down_proj"]); its factors are made up here, so that the
example needs numpy and safetensors only, not torch or peft.

    python3 -m venv .venv && .venv/bin/pip install numpy safetensors
    .venv/bin/python examples/make_adapters.py --out adapters      # demo sizes
    ./build/lorasink --demo --adapter-dir adapters &
    .venv/bin/python examples/make_adapters.py --out adapters --server http://127.0.0.1:8080

It writes into --out:
    my-adapter/                    PEFT directory: adapter_config.json + adapter_model.safetensors
    my-adapter.safetensors         PEFT tensors, parameters in __metadata__ (a raw body, or a path)
    my-adapter-pool.safetensors    pool format, scale folded into the B factors
    my-adapter-inline.json         a JSON body for POST /adapters with base64 tensors
and the same four with an -interleaved suffix, whose gate_up_proj.lora_B
rows alternate gate, up, gate, up (declared with gate_up_order).
"""
import argparse
import base64
import json
import math
import os
import sys
import urllib.error
import urllib.request

import numpy as np
from safetensors.numpy import load_file, save_file

PEFT_PREFIX = "base_model.model."  # what PEFT puts before the model's own names


def layer_prefix(l):
    return f"model.layers.{l}.mlp.shared_experts."


def train_stand_in(n, H, F, L, r, seed):
    """The factors a PEFT training run would leave, per layer: gate_up_proj
    lora_A [r, H] and lora_B [n*2F, r] (each expert's F gate rows, then its
    F up rows), down_proj lora_A [r, n*F] (expert-major columns) and
    lora_B [H, r]."""
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(L):
        layers.append({
            "gate_up_proj.lora_A": (rng.standard_normal((r, H)) / math.sqrt(H)).astype(np.float32),
            "gate_up_proj.lora_B": (rng.standard_normal((n * 2 * F, r)) * 0.01).astype(np.float32),
            "down_proj.lora_A": (rng.standard_normal((r, n * F)) / math.sqrt(n * F)).astype(np.float32),
            "down_proj.lora_B": (rng.standard_normal((H, r)) * 0.01).astype(np.float32),
        })
    return layers


def interleave(b, n, F):
    """gate_up_proj.lora_B from gate-then-up rows to alternating rows: row
    2j of an expert is its gate row j, row 2j+1 its up row j."""
    r = b.shape[1]
    e = b.reshape(n, 2, F, r)  # [expert, gate|up, j, r]
    return np.ascontiguousarray(e.transpose(0, 2, 1, 3).reshape(n * 2 * F, r))


def peft_tensors(layers, n, F, order):
    """PEFT's names (with its base_model.model. prefix) and 2D factors."""
    out = {}
    for l, f in enumerate(layers):
        for module, t in f.items():
            if module == "gate_up_proj.lora_B" and order == "interleaved":
                t = interleave(t, n, F)
            out[PEFT_PREFIX + layer_prefix(l) + module + ".weight"] = t
    return out


def peft_scale(alpha, r, rslora):
    return alpha / math.sqrt(r) if rslora else alpha / r


def pool_tensors(layers, n, H, F, r, scale):
    """The pool format: four 4D buffers per layer, axis 0 the slot (1).
    gate_up_lora_a [1, 1, 2r, H]: rows 0..r-1 feed gate, r..2r-1 feed up;
    PEFT's one lora_A feeds both, so it is written twice.
    gate_up_lora_b [1, n, 2F, r]: per expert F gate rows, then F up rows.
    down_lora_a [1, n, r, F]: PEFT's [r, n*F] split per expert.
    down_lora_b [1, 1, H, r]. The B factors carry the scale (computed in
    float64 and rounded once, as the server does), so no scale is sent."""
    out = {}
    for l, f in enumerate(layers):
        p = layer_prefix(l)
        a = f["gate_up_proj.lora_A"]
        out[p + "gate_up_lora_a"] = np.concatenate([a, a], axis=0).reshape(1, 1, 2 * r, H)
        b = f["gate_up_proj.lora_B"].astype(np.float64) * scale
        out[p + "gate_up_lora_b"] = b.astype(np.float32).reshape(1, n, 2 * F, r)
        da = f["down_proj.lora_A"].reshape(r, n, F).transpose(1, 0, 2)
        out[p + "down_lora_a"] = np.ascontiguousarray(da).reshape(1, n, r, F)
        db = f["down_proj.lora_B"].astype(np.float64) * scale
        out[p + "down_lora_b"] = db.astype(np.float32).reshape(1, 1, H, r)
    return out


def b64_tensor(t):
    """{"dtype", "shape", "data"}: little-endian values, row-major."""
    t = np.ascontiguousarray(t, dtype="<f4")
    return {"dtype": "f32", "shape": list(t.shape), "data": base64.b64encode(t.tobytes()).decode()}


def write_all(out, layers, args, order):
    sfx = "" if order == "gate_up" else "-interleaved"
    n, H, F, r = args.experts, args.hidden, args.intermediate, args.rank
    tensors = peft_tensors(layers, n, F, order)
    config = {"peft_type": "LORA", "r": r, "lora_alpha": args.alpha, "use_rslora": args.rslora,
              "target_modules": ["gate_up_proj", "down_proj"], "gate_up_order": order}

    # 1. The PEFT directory, as model.save_pretrained(dir) leaves it (PEFT
    #    writes no gate_up_order: add it when the rows alternate).
    d = os.path.join(out, "my-adapter" + sfx)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "adapter_config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    save_file(tensors, os.path.join(d, "adapter_model.safetensors"))

    # 2. One safetensors file: the parameters go to __metadata__ (strings).
    meta = {"r": str(r), "lora_alpha": repr(float(args.alpha)), "use_rslora": str(args.rslora).lower(),
            "gate_up_order": order}
    save_file(tensors, os.path.join(out, f"my-adapter{sfx}.safetensors"), metadata=meta)

    # 3. The pool format, scale folded in.
    scale = peft_scale(args.alpha, r, args.rslora)
    save_file(pool_tensors(layers, n, H, F, r, scale), os.path.join(out, f"my-adapter{sfx}-pool.safetensors"),
              metadata={"format": "pool"})

    # 4. An inline JSON body (names may keep or drop the base_model.model. prefix).
    body = {"name": f"my-adapter{sfx}-inline", "format": "peft", "gate_up_order": order,
            "config": {"r": r, "lora_alpha": args.alpha, "use_rslora": args.rslora},
            "tensors": {k[len(PEFT_PREFIX):]: b64_tensor(v) for k, v in tensors.items()}}
    with open(os.path.join(out, f"my-adapter{sfx}-inline.json"), "w") as fh:
        json.dump(body, fh)


def http(server, key, method, path, body=None, content_type="application/json"):
    headers = {"Authorization": "Bearer " + key} if key else {}
    if body is not None:
        headers["Content-Type"] = content_type
    req = urllib.request.Request(server + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def expect(what, status, body, want):
    if status != want:
        sys.exit(f"{what}: HTTP {status}, expected {want}: {body.decode(errors='replace')}")
    return json.loads(body)


def load_and_check(out, args):
    """Loads every form (201), checks they normalise to one sha256, and runs
    one forward in which each token uses another form: every row of y must
    be the same, as the adapters are the same."""
    s, k = args.server.rstrip("/"), args.api_key
    loaded = []
    for sfx in ("", "-interleaved"):
        # by path, beneath the server's --adapter-dir (which must be --out)
        for name, path in ((f"my-adapter{sfx}-dir", f"my-adapter{sfx}"),
                           (f"my-adapter{sfx}-file", f"my-adapter{sfx}.safetensors")):
            body = json.dumps({"name": name, "path": path, "replace": True}).encode()
            loaded.append(expect(f"POST /adapters {path}", *http(s, k, "POST", "/adapters", body), 201))
        # raw safetensors bodies, parameters from __metadata__ (query would win)
        for name, f in ((f"my-adapter{sfx}-raw", f"my-adapter{sfx}.safetensors"),
                        (f"my-adapter{sfx}-pool", f"my-adapter{sfx}-pool.safetensors")):
            with open(os.path.join(out, f), "rb") as fh:
                st = http(s, k, "POST", f"/adapters?name={name}&replace=true", fh.read(), "application/octet-stream")
            loaded.append(expect(f"POST /adapters {f}", *st, 201))
        with open(os.path.join(out, f"my-adapter{sfx}-inline.json")) as fh:
            body = json.load(fh)
        body["replace"] = True
        loaded.append(expect("POST /adapters inline", *http(s, k, "POST", "/adapters", json.dumps(body).encode()), 201))
    digests = {a["name"]: a["sha256"] for a in loaded}
    if len(set(digests.values())) != 1:
        sys.exit("the forms normalise to different factors: " + json.dumps(digests, indent=1))
    x = np.full((len(loaded) + 1, args.hidden), 0.05, np.float32).tolist()
    names = [a["name"] for a in loaded] + [None]  # the last token runs on the base model
    fwd = expect("POST /forward", *http(s, k, "POST", "/forward", json.dumps({"x": x, "adapters": names}).encode()), 200)
    y = fwd["y"]
    if any(row != y[0] for row in y[:-1]):
        sys.exit("the forms give different outputs")
    if y[-1] == y[0]:
        sys.exit("the adapter changes nothing: the base model gives the same output")
    print(f"{len(loaded)} adapters loaded (201), one sha256 {loaded[0]['sha256'][:16]}..., one output")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory to write into (the server's --adapter-dir)")
    ap.add_argument("--experts", type=int, default=2, help="n, the shared experts (demo: 2)")
    ap.add_argument("--hidden", type=int, default=1024, help="H (demo: 1024)")
    ap.add_argument("--intermediate", type=int, default=512, help="F (demo: 512)")
    ap.add_argument("--layers", type=int, default=2, help="L (demo: 2)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--rslora", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server", help="a running lorasink whose --adapter-dir is --out: load and check every form")
    ap.add_argument("--api-key", default=os.environ.get("LORASINK_API_KEY", ""))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    layers = train_stand_in(args.experts, args.hidden, args.intermediate, args.layers, args.rank, args.seed)
    for order in ("gate_up", "interleaved"):
        write_all(args.out, layers, args, order)
    # What was written reads back as written.
    back = load_file(os.path.join(args.out, "my-adapter", "adapter_model.safetensors"))
    assert set(back) == set(peft_tensors(layers, args.experts, args.intermediate, "gate_up"))
    print(f"wrote the PEFT directory, PEFT safetensors, pool and inline forms to {args.out}")
    if args.server:
        load_and_check(args.out, args)


if __name__ == "__main__":
    main()
