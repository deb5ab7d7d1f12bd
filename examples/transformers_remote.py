#!/usr/bin/env python3
"""A transformers model whose shared experts run on lorasink, end to end
(docs/python.md walks through it).

Loads a PEFT adapter into the server from its directory, replaces the
model's shared experts with lorasink.torch.RemoteSharedExperts, and checks
the result against the same model with the adapter applied locally by
PEFT: the logits of a batch, and greedy generation token for token. Then
times one layer's hop.

With no arguments it makes a tiny random Qwen2-MoE checkpoint and a random
adapter in a temporary directory and starts build/lorasink on it:

    python3 -m venv .venv && .venv/bin/pip install ./clients/python torch transformers peft
    .venv/bin/python examples/transformers_remote.py

With your own (the server must serve --weights MODEL_DIR; the adapter is a
directory PEFT's save_pretrained wrote, on this machine):

    ./build/lorasink --weights MODEL_DIR &
    .venv/bin/python examples/transformers_remote.py --model MODEL_DIR --adapter ADAPTER_DIR --server http://127.0.0.1:8080

Exit status 0 when the remote model gave PEFT's logits (relative L2 at
most --tol) and PEFT's tokens.
"""
import argparse
import copy
import os
import subprocess
import sys
import tempfile
import time
import warnings

import torch

warnings.filterwarnings("ignore")
import transformers  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402

transformers.logging.disable_progress_bar()

import lorasink  # noqa: E402
from lorasink.torch import RemoteSharedExperts, replace_shared_experts  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_tiny(work):
    """A tiny random Qwen2-MoE checkpoint and a random LoRA adapter on its
    shared experts (a regex target: the plain names would also adapt
    the dense layer's MLP, which lorasink does not serve)."""
    torch.manual_seed(0)
    cfg = transformers.Qwen2MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                      moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                      num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1])
    model = transformers.Qwen2MoeForCausalLM(cfg)
    model.save_pretrained(os.path.join(work, "model"))
    lora = LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                      target_modules=r".*\.shared_expert\.(gate_proj|up_proj|down_proj)")
    get_peft_model(model, lora).save_pretrained(os.path.join(work, "adapter"))
    return os.path.join(work, "model"), os.path.join(work, "adapter")


def start_server(binary, model_dir, log):
    """lorasink on an ephemeral port, its log into log; (process, url)."""
    proc = subprocess.Popen([binary, "--weights", model_dir, "--port", "0", "--access-log=false"],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()  # "listening on http://127.0.0.1:PORT", or EOF if it failed
    if not line.startswith("listening on "):
        proc.kill()
        log.seek(0)
        sys.exit(f"lorasink did not start:\n{log.read()}")
    return proc, line.split()[-1]


def rel(a, b):
    return (torch.linalg.norm(a - b) / torch.linalg.norm(b)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a transformers checkpoint directory (default: a tiny random Qwen2-MoE)")
    ap.add_argument("--adapter", help="a PEFT adapter directory on this machine (default: a random one)")
    ap.add_argument("--server", help="a running lorasink that serves --model (default: start --lorasink)")
    ap.add_argument("--lorasink", default=os.path.join(ROOT, "build", "lorasink"), help="the binary to start")
    ap.add_argument("--api-key", default=os.environ.get("LORASINK_API_KEY"))
    ap.add_argument("--tol", type=float, default=1e-5, help="largest relative L2 error of the logits")
    args = ap.parse_args()
    work = tempfile.TemporaryDirectory(prefix="lorasink-example-")
    model_dir, adapter_dir = args.model, args.adapter
    if not model_dir:
        model_dir, adapter_dir = make_tiny(work.name)
    elif not adapter_dir:
        sys.exit("--model needs --adapter: a PEFT directory trained on that model")
    log = open(os.path.join(work.name, "lorasink.log"), "w+")
    proc, url = (None, args.server) if args.server else start_server(args.lorasink, model_dir, log)
    try:
        return run(url, args.api_key, model_dir, adapter_dir, args.tol)
    finally:
        if proc:
            proc.terminate()
            proc.wait()
        log.close()
        work.cleanup()


def run(url, api_key, model_dir, adapter_dir, tol):
    client = lorasink.Client(url, api_key=api_key)
    client.wait_ready()
    served = client.model()
    print(f"server {url}: {served['family']}, H={served['hidden']}, layers with shared experts {served['layers']}, "
          f"gate {served['gate']}")
    info = client.load("example", peft_dir=adapter_dir, replace=True)
    print(f"loaded adapter 'example' v{info['version']}: rank {info['rank']}, scale {info['scale']}, "
          f"{len(info['ignored'])} tensors of other modules ignored")
    if info["ignored"]:
        print("  the model below applies those locally too, so its logits cannot match: "
              "train the adapter on the shared experts only")

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    local = PeftModel.from_pretrained(copy.deepcopy(model), adapter_dir).eval()
    layers = replace_shared_experts(model, client, adapter="example")
    print(f"replaced the shared experts of layers {layers} with RemoteSharedExperts")

    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        err = rel(model(ids).logits, local(ids).logits)
        kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
        same = torch.equal(model.generate(input_ids=ids, **kw), local.generate(input_ids=ids, **kw))
    print(f"logits vs PEFT's: relative L2 {err:.2e} (tolerance {tol:g}); greedy tokens "
          f"{'the same' if same else 'DIFFERENT'}")

    hop = next(m for m in model.modules() if isinstance(m, RemoteSharedExperts))
    for T in (1, 128):
        x = torch.randn(T, model.config.hidden_size)
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            hop(x)
            times.append((time.perf_counter() - t0) * 1e6)
        times.sort()
        print(f"one layer's hop, T={T}: median {times[100]:.0f} µs, p99 {times[197]:.0f} µs")
    client.close()
    return 0 if err <= tol and same else 1


if __name__ == "__main__":
    sys.exit(main())
