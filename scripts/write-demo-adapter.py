#!/usr/bin/env python3
"""Writes a PEFT LoRA directory for the checkpoint write-demo-checkpoint.py
writes, laid out as PEFT's save_pretrained lays it out: adapter_config.json
and adapter_model.safetensors, with factors on the shared expert's
gate_proj, up_proj and down_proj of its MoE layers (0 and 2), which its
target_modules names exactly (PEFT loads it onto the transformers model
with no key missing: scripts/check-hf.sh checks that). It stands for the
adapter you trained: the README's Try it loads it by path.

Values are small f32 numbers drawn from SHAKE-256 of --seed; no torch,
numpy or peft needed.

    python3 scripts/write-demo-adapter.py DIR [--rank 8] [--alpha 16] [--seed 7]
"""
import argparse
import hashlib
import json
import os
import struct

H, SHARED_F, MOE_LAYERS = 1024, 1024, (0, 2)  # write-demo-checkpoint.py's sizes


def f32_values(tag, seed, count):
    """count floats in [-1/64, 1/64), from SHAKE-256 of seed and tag."""
    raw = hashlib.shake_256(f"{seed}:{tag}".encode()).digest(2 * count)
    vals = struct.unpack(f"<{count}H", raw)
    return struct.pack(f"<{count}f", *((v / 65536.0 - 0.5) / 32.0 for v in vals))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    r = a.rank
    tensors = []
    for l in MOE_LAYERS:
        p = f"base_model.model.model.layers.{l}.mlp.shared_expert."
        for mod, (a_cols, b_rows) in {"gate_proj": (H, SHARED_F), "up_proj": (H, SHARED_F),
                                      "down_proj": (SHARED_F, H)}.items():
            tensors.append((p + mod + ".lora_A.weight", [r, a_cols]))
            tensors.append((p + mod + ".lora_B.weight", [b_rows, r]))
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape in tensors:
        blob = f32_values(name, a.seed, shape[0] * shape[1])
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "demo-checkpoint",
              "r": r, "lora_alpha": a.alpha, "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
              # Only the shared expert: the list ["gate_proj", "up_proj", "down_proj"]
              # would also name layer 1's dense MLP, which this adapter leaves alone.
              "target_modules": r".*\.shared_expert\.(gate_proj|up_proj|down_proj)"}
    with open(os.path.join(a.out, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    print(f"wrote {a.out}/adapter_config.json and adapter_model.safetensors (r={r}, lora_alpha={a.alpha:g})")


if __name__ == "__main__":
    main()
