#!/usr/bin/env python3
"""Writes a small Hugging Face checkpoint directory in the Qwen2-MoE layout,
for the README's first example and for trying --weights DIR: config.json,
model.safetensors.index.json and two shards, as save_pretrained lays them out;
transformers loads it as it is (scripts/check-hf.sh checks that).

Its 3 decoder layers have H = 1024; layers 0 and 2 are MoE layers with one
shared expert of width 1024 (mlp.shared_expert.{gate,up,down}_proj and
mlp.shared_expert_gate), layer 1 is dense (config.json's mlp_only_layers).
Beside them it holds the other tensors a real checkpoint has (embeddings,
attention, the router and routed experts, the dense MLP), which lorasink
never reads. Values are bf16, drawn from SHAKE-256 of --seed, so the same
seed writes the same bytes; no torch or numpy needed.

    python3 scripts/write-demo-checkpoint.py DIR [--seed 42]
"""
import argparse
import hashlib
import json
import os
import struct

H, LAYERS, SHARED_F, ROUTED, ROUTED_F, DENSE_F, VOCAB = 1024, 3, 1024, 4, 256, 2048, 512
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64  # config.json says head_dim, so q_proj is [256, H] as written
MOE_LAYERS = (0, 2)


def bf16_values(tag, seed, count, exponent):
    """count bf16 values of magnitude [2^e, 2^(e+2)) with random signs and
    mantissas: the low byte is SHAKE-256 output as it stands, the high byte
    maps through a table to a sign and one of two exponents."""
    data = bytearray(hashlib.shake_256(f"{seed}:{tag}".encode()).digest(2 * count))
    table = bytes(((b & 0x80) | ((exponent + 127) >> 1) + (b & 1)) & 0xFF for b in range(256))
    data[1::2] = bytes(data[1::2]).translate(table)
    return bytes(data)


def write_shard(path, tensors):
    """tensors: list of (name, shape, bytes) in bf16; the header padded to 8."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, blob in tensors:
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, blob in tensors:
            f.write(blob)


def layer_tensors(l, seed):
    """Every tensor of decoder layer l: (name, shape, bytes)."""
    p = f"model.layers.{l}."
    t = lambda name, shape, e: (p + name, shape, bf16_values(p + name, seed, shape[0] * shape[1], e))
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    out = [t("input_layernorm.weight", [1, H], -1), t("post_attention_layernorm.weight", [1, H], -1),
           t("self_attn.q_proj.weight", [q, H], -8), t("self_attn.q_proj.bias", [1, q], -8),
           t("self_attn.k_proj.weight", [kv, H], -8), t("self_attn.k_proj.bias", [1, kv], -8),
           t("self_attn.v_proj.weight", [kv, H], -8), t("self_attn.v_proj.bias", [1, kv], -8),
           t("self_attn.o_proj.weight", [H, q], -8)]
    if l in MOE_LAYERS:
        out += [t("mlp.gate.weight", [ROUTED, H], -6), t("mlp.shared_expert_gate.weight", [1, H], -7),
                t("mlp.shared_expert.gate_proj.weight", [SHARED_F, H], -7),
                t("mlp.shared_expert.up_proj.weight", [SHARED_F, H], -7),
                t("mlp.shared_expert.down_proj.weight", [H, SHARED_F], -7)]
        for e in range(ROUTED):
            out += [t(f"mlp.experts.{e}.gate_proj.weight", [ROUTED_F, H], -7),
                    t(f"mlp.experts.{e}.up_proj.weight", [ROUTED_F, H], -7),
                    t(f"mlp.experts.{e}.down_proj.weight", [H, ROUTED_F], -7)]
    else:
        out += [t("mlp.gate_proj.weight", [DENSE_F, H], -7), t("mlp.up_proj.weight", [DENSE_F, H], -7),
                t("mlp.down_proj.weight", [H, DENSE_F], -7)]
    # layer norms and biases are vectors in a real checkpoint
    return [(n, [s[1]] if "layernorm" in n or n.endswith(".bias") else s, b) for n, s, b in out]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    config = {
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": H,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "qkv_bias": True, "vocab_size": VOCAB,
        "intermediate_size": DENSE_F, "moe_intermediate_size": ROUTED_F, "shared_expert_intermediate_size": SHARED_F,
        "num_experts": ROUTED, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [1],
        "norm_topk_prob": False, "hidden_act": "silu", "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
    }
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    embed = ("model.embed_tokens.weight", [VOCAB, H], bf16_values("embed", args.seed, VOCAB * H, -6))
    shards = {"model-00001-of-00002.safetensors": [embed] + layer_tensors(0, args.seed) + layer_tensors(1, args.seed),
              "model-00002-of-00002.safetensors": layer_tensors(2, args.seed) +
              [("model.norm.weight", [H], bf16_values("norm", args.seed, H, -1)),
               ("lm_head.weight", [VOCAB, H], bf16_values("lm_head", args.seed, VOCAB * H, -6))]}
    weight_map, total = {}, 0
    for name, tensors in shards.items():
        write_shard(os.path.join(args.dir, name), tensors)
        for tname, _, blob in tensors:
            weight_map[tname] = name
            total += len(blob)
    with open(os.path.join(args.dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    print(f"wrote {args.dir}: qwen2_moe, H={H}, layers {LAYERS} (shared experts on {MOE_LAYERS[0]} and "
          f"{MOE_LAYERS[1]}), 2 shards, {total / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
