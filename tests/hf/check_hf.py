"""lorasink against the real transformers and peft libraries.

Builds tiny random-init DeepSeek-V3 and Qwen2-MoE models with transformers
(save_pretrained, small shards), creates PEFT LoRA adapters on their shared
experts with random A and B (one with rank_pattern, alpha_pattern and
rsLoRA, one on some layers only), saves them with save_pretrained, serves the
checkpoint directory and the adapter directories with lorasink as they
were saved, and compares forwards of the shared-expert block (per-token
mixed adapters, Qwen's gate applied by the server) with the modules' own
forward with the adapter active: relative L2 error at most 2e-5 in f32.
Each family has a dense layer, so the server must keep the checkpoint's
layer numbers, refuse a forward on the dense one and skip the dense MLP's
factors.

Usage: check_hf.py LORASINK_BINARY WORKDIR  (run by scripts/check-hf.sh)
"""
import copy
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import warnings

import numpy as np
import torch
from safetensors import safe_open

warnings.filterwarnings("ignore")
import peft  # noqa: E402
import transformers  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402

TOL = 2e-5
LAYERS = 4


def tiny_models():
    """(name, model, shared-expert attribute, has gate, MoE layers) per
    family; DeepSeek's layer 0 and Qwen's layer 1 are dense."""
    ds = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=LAYERS,
        num_attention_heads=2, num_key_value_heads=2, n_shared_experts=2, n_routed_experts=4, num_experts_per_tok=2,
        first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=8, n_group=1, topk_group=1)
    qw = transformers.Qwen2MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[1])
    return [("deepseek_v3", transformers.DeepseekV3ForCausalLM(ds), "shared_experts", False, [1, 2, 3]),
            ("qwen2_moe", transformers.Qwen2MoeForCausalLM(qw), "shared_expert", True, [0, 2, 3])]


def targets(family, shared, layers=None):
    """The way today's PEFT reaches the shared experts (docs/adapters.md):
    Qwen2-MoE by target_modules; DeepSeek-V3 only by target_parameters,
    since transformers 5's conversion rewrites gate_proj/up_proj/down_proj
    module targets (names, full names and regexes) into the routed
    experts' fused parameters."""
    projs = ("gate_proj", "up_proj", "down_proj")
    if family == "deepseek_v3":
        if layers is None:
            return {"target_modules": None, "target_parameters": [f"mlp.{shared}.{p}.weight" for p in projs]}
        return {"target_modules": None,
                "target_parameters": [f"model.layers.{l}.mlp.{shared}.{p}.weight" for l in layers for p in projs]}
    out = {"target_modules": list(projs)}
    if layers is not None:
        out["layers_to_transform"] = list(layers)
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(port, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def start_server(binary, weights, adapter_dir, log):
    port = free_port()
    proc = subprocess.Popen([binary, "--weights", weights, "--device", "cpu", "--port", str(port), "--max-rank",
                             "16", "--adapter-dir", adapter_dir], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(300):
        try:
            if http(port, "GET", "/ready")[0] == 200:
                return proc, port
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("lorasink did not become ready; see " + log.name)


def module_forward(model, layer, shared, has_gate, x):
    """The block's output from the transformers modules themselves."""
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    mlp = base.model.layers[layer].mlp
    y = getattr(mlp, shared)(x)
    if has_gate:
        y = torch.sigmoid(mlp.shared_expert_gate(x)) * y
    return y


def check_model(port, family, moe_layers, has_gate, results):
    """GET /model says what was loaded; a dense layer is a clear 400."""
    st, m = http(port, "GET", "/model")
    if st != 200 or m.get("layers") != moe_layers or bool(m.get("gate")) != has_gate:
        raise RuntimeError(f"{family}: GET /model {st} {json.dumps(m)}")
    dense = next(l for l in range(LAYERS) if l not in moe_layers)
    st, r = http(port, "POST", "/forward", {"layer": dense, "x": [[0.0] * m["hidden"]]})
    if st != 400 or "dense" not in r["error"]["message"]:
        raise RuntimeError(f"{family}: forward on dense layer {dense}: {st} {json.dumps(r)}")
    results.append(f"{family}: GET /model {m.get('family')} layers {m['layers']} gate {m.get('gate')}; "
                   f"dense layer {dense}: 400")


def check_family(binary, work, family, model, shared, has_gate, moe_layers, results):
    torch.manual_seed(1)
    ckpt = os.path.join(work, family, "checkpoint")
    model.save_pretrained(ckpt, max_shard_size="20KB")
    adir = os.path.join(work, family, "adapters")
    os.makedirs(adir, exist_ok=True)
    # Two adapters: rank_pattern + alpha_pattern + rsLoRA on every layer,
    # and plain LoRA on layers 0 and 2 only. Random A and B (nonzero B).
    # PEFT matches the patterns against the module's name, or for
    # target_parameters against "{module}.weight".
    w = ".weight" if family == "deepseek_v3" else ""
    cfg_a = LoraConfig(r=4, lora_alpha=8, use_rslora=True, init_lora_weights=False,
                       rank_pattern={"up_proj" + w: 6, f"model.layers.2.mlp.{shared}.down_proj" + w: 2},
                       alpha_pattern={"gate_proj" + w: 12}, **targets(family, shared))
    some = (moe_layers[0], moe_layers[2])
    cfg_b = LoraConfig(r=3, lora_alpha=6, init_lora_weights=False, **targets(family, shared, layers=some))
    for name, cfg in (("ranks", cfg_a), ("some-layers", cfg_b)):
        torch.manual_seed(len(name))
        pm = get_peft_model(model, cfg)
        pm.save_pretrained(os.path.join(adir, name))
        model = pm.unload()
    keys = {}
    for name in ("ranks", "some-layers"):
        with safe_open(os.path.join(adir, name, "adapter_model.safetensors"), "np") as f:
            keys[name] = sorted(f.keys())
    # One PeftModel per adapter: PEFT refuses two target_parameters
    # adapters of different parameter sets in one model.
    active = {name: PeftModel.from_pretrained(copy.deepcopy(model), os.path.join(adir, name)).eval()
              for name in ("ranks", "some-layers")}
    model.eval()

    log = open(os.path.join(work, family, "lorasink.log"), "w")
    proc, port = start_server(binary, ckpt, adir, log)
    try:
        check_model(port, family, moe_layers, has_gate, results)
        for name in ("ranks", "some-layers"):
            st, r = http(port, "POST", "/adapters", {"name": name, "path": name})
            if st != 201:
                raise RuntimeError(f"{family}/{name}: {st} {json.dumps(r)}")
            results.append(f"{family}: loaded {name}: rank {r['rank']}, {len(keys[name])} tensors, "
                           f"ignored {len(r.get('ignored', []))}")
        names = ["ranks", "some-layers", None]
        worst = 0.0
        for layer in moe_layers:
            T = 9
            x = torch.randn(T, model.config.hidden_size)
            expected = torch.zeros(T, model.config.hidden_size)
            with torch.no_grad():
                for t in range(T):
                    a = names[t % 3]
                    expected[t] = module_forward(active[a] if a else model, layer, shared, has_gate, x[t:t + 1])[0]
            # No gammas: the server applies Qwen's shared_expert_gate itself.
            st, r = http(port, "POST", "/forward", {"layer": layer, "x": x.tolist(),
                                                    "adapters": [names[t % 3] for t in range(T)]})
            if st != 200:
                raise RuntimeError(f"{family}: forward {st} {json.dumps(r)}")
            y = torch.tensor(r["y"])
            rel = (torch.linalg.norm(y - expected) / torch.linalg.norm(expected)).item()
            worst = max(worst, rel)
            results.append(f"{family}: layer {layer}, {T} tokens (ranks, some-layers, none): relative L2 {rel:.2e}")
        if worst > TOL:
            raise RuntimeError(f"{family}: relative error {worst:.3g} above {TOL}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def main():
    binary, work = sys.argv[1], sys.argv[2]
    torch.set_default_dtype(torch.float32)
    results = [f"transformers {transformers.__version__}, peft {peft.__version__}, torch {torch.__version__}, "
               f"numpy {np.__version__}"]
    ok = True
    for family, model, shared, has_gate, moe_layers in tiny_models():
        try:
            check_family(binary, work, family, model, shared, has_gate, moe_layers, results)
            results.append(f"PASS {family}")
        except Exception as e:  # report every family
            ok = False
            results.append(f"FAIL {family}: {e}")
    print("\n".join(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
