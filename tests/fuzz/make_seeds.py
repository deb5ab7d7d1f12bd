#!/usr/bin/env python3
"""Writes the seed corpora of the parser harnesses: tests/fuzz/corpus/HARNESS/NAME.

A handful of small valid and near-valid inputs per harness (docs/fuzzing.md);
scripts/fuzz.sh runs each harness on a temporary copy, so these files only
change when this script is run again. The fuzz_forward_json and
fuzz_forward_safetensors seeds use the harnesses' model: n=2 experts, H=4,
L=2 layers, at most 8 tokens. The raw upload and safetensors forward
harnesses also read tests/data/hostile (make_hostile.py) as it is.
Standard library only.

    python3 tests/fuzz/make_seeds.py [CORPUS_DIR]
"""
import base64
import json
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def js(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


def b64(fmt, values):
    return base64.b64encode(struct.pack("<" + fmt * len(values), *values)).decode()


def safetensors(tensors, meta=None):
    """tensors: name -> (dtype, shape, raw bytes), laid out in order."""
    header, body = {}, b""
    if meta is not None:
        header["__metadata__"] = meta
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(body), len(body) + len(data)]}
        body += data
    h = js(header)
    return struct.pack("<Q", len(h)) + h + body


def query(pairs):
    """The raw harness's query block: '?', NUL-separated key=value, an empty pair."""
    return b"?" + b"".join(p.encode() + b"\0" for p in pairs) + b"\0"


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def forward_json():
    x1 = [[1, 2, 3, 4]]
    x2 = [[0.5, -1e-3, 3.40282347e38, -0.0], [1.401298464e-45, 2, 3, 4]]
    c = {
        "minimal.json": js({"x": x1}),
        "full.json": js({"layer": 1, "x": x2, "gammas": [[1, 0], [0.5, 0.5]], "adapter": "my-adapter.v1",
                         "encoding": "json"}),
        "per_token.json": json.dumps({"layer": 0, "x": x2, "adapters": ["a", None]}, indent=1).encode(),
        "base64.json": js({"x": {"dtype": "f32", "shape": [1, 4], "data": b64("f", [1.5, -2, 0, 1e-40])},
                           "gammas": {"dtype": "bf16", "shape": [1, 2], "data": b64("H", [0x3F80, 0x4000])},
                           "encoding": "base64", "adapter": None}),
        "f16.json": js({"x": {"dtype": "f16", "shape": [2, 4], "data": b64("H", [0x3C00] * 8)},
                        "adapters": None, "gammas": None}),
        # near-valid: each breaks one rule
        "row_width.json": js({"x": [[1, 2, 3]]}),
        "too_many_rows.json": js({"x": [[0, 0, 0, 0]] * 9}),
        "layer_range.json": js({"layer": 2, "x": x1}),
        "layer_real.json": b'{"layer":1.0,"x":[[1,2,3,4]]}',
        "unknown_key.json": js({"x": x1, "y": 1}),
        "duplicate_key.json": b'{"x":[[1,2,3,4]],"x":[[1,2,3,4]]}',
        "not_finite.json": b'{"x":[[1e39,2,3,4]]}',
        "bad_name.json": js({"x": x1, "adapter": ".hidden"}),
        "both_names.json": js({"x": x1, "adapter": "a", "adapters": ["a"]}),
        "adapters_count.json": js({"x": x1, "adapters": ["a", "b"]}),
        "one_dimensional.json": js({"x": [1, 2, 3, 4]}),
        "big_shape.json": js({"x": {"dtype": "f16", "shape": [29223372036854775808, 4], "data": "AAAA"}}),
        "truncated.json": b'{"x":[[1,2,3,4]],"gammas":[[1,\\u00',
        "strings.json": b'{"x":[[1,2,3,4]],"adapter":"\\u00e9\\ud83d\\ude00"}',
        # found by fuzz_forward_json: the reply's y, FLT_MAX written as
        # 3.40282347e38, did not read back through ls_json_tensor_parse
        "regress_flt_max.json": b'{"x":[[3.4028235e38,-3.40282347e38,1,2]],"encoding":"json"}',
        # found probing the reader's depth limit: nesting inside the body's
        # object and inside x or gammas was counted from where ls_jr_skip
        # began, not from the top as jansson counts (2048 levels)
        "regress_depth_key.json": b'{"k":' + b"[" * 2048 + b"]" * 2048 + b"}",
        "regress_depth_gammas.json": b'{"x":[[1,2,3,4]],"gammas":' + b"[" * 2049 + b"]" * 2049 + b"}",
    }
    return c


LORA_A = "base_model.model.model.layers.0.mlp.shared_experts.gate_proj.lora_A.weight"


def forward_safetensors():
    x2 = f32(0.5, -1e-3, 3.40282347e38, -0.0, 1.401298464e-45, 2, 3, 4)
    mixed = {"adapters": js(["a", None]).decode(), "format": "pt"}
    return {
        "minimal.safetensors": safetensors({"x": ("F32", (1, 4), f32(1, 2, 3, 4))}),
        "gammas_bf16.safetensors": safetensors({"x": ("BF16", (1, 4), struct.pack("<4H", 0x3F80, 0, 0x8000, 0x4000)),
                                                "gammas": ("F16", (1, 2), struct.pack("<2H", 0x3C00, 0x3800))}),
        "per_token.safetensors": safetensors({"x": ("F32", (2, 4), x2)}, mixed),
        "two_names.safetensors": safetensors({"x": ("F32", (2, 4), x2)}, {"adapters": js(["b", "a.1"]).decode()}),
        "per_token_routed.safetensors": b"?a\0" + safetensors({"x": ("F32", (2, 4), x2)}, mixed),
        "routed.safetensors": b"?my-adapter.v1\0" + safetensors({"x": ("F32", (2, 4), x2)}),
        "wrong_length.safetensors": safetensors({"x": ("F32", (2, 4), x2)}, {"adapters": js(["a"]).decode()}),
        "unknown_key.safetensors": safetensors({"x": ("F32", (1, 4), f32(1, 2, 3, 4))}, {"layer": "1"}),
    }


def adapter_upload_json():
    return {
        "path.json": js({"name": "a", "path": "adapters/a", "pinned": True, "replace": False}),
        "tensors.json": js({"name": "b.v1", "format": "peft", "config": {"r": 2, "lora_alpha": 4, "use_rslora": False},
                            "tensors": {LORA_A: [[1, 2], [3, 4]]}, "scale": 0.5, "strict": True}),
        "base64.json": js({"name": "c_2", "format": "pool", "config": None, "scale": None,
                           "tensors": {"gate_up_lora_a": {"dtype": "f16", "shape": [1, 1, 2, 2],
                                                          "data": b64("H", [0x3C00, 0, 0, 0x3C00])},
                                       "down_lora_b": {"dtype": "f32", "shape": [0], "data": ""}}}),
        "validate.json": js({"config": {"r": 8}, "tensors": {}}),
        # 3.4028235e38, FLT_MAX as float32 prints, rounds to FLT_MAX: accepted
        "flt_max.json": b'{"name":"m","tensors":{"t":[3.4028235e38,-3.4028235e38,1e-46]}}',
        # near-valid
        "both.json": js({"name": "a", "path": "p", "tensors": {}}),
        "unknown_key.json": js({"name": "a", "path": "p", "alpha": 1}),
        "bad_name.json": js({"name": ".a", "path": "p"}),
        "bad_scale.json": js({"name": "a", "path": "p", "scale": "1"}),
        "bad_config.json": js({"name": "a", "tensors": {}, "config": {"r": 0, "lora_alpha": "x"}}),
        "bad_format.json": js({"name": "a", "path": "p", "format": "lora"}),
        "ragged.json": js({"name": "a", "tensors": {"t": [[1, 2], [3]]}}),
        "bad_base64.json": js({"name": "a", "tensors": {"t": {"dtype": "f32", "shape": [1], "data": "AAA="}}}),
        "duplicate.json": b'{"name":"a","name":"b","path":"p"}',
        # the one-pass reader (api/json_tensor_read.c) against what a parse
        # of the whole body gave: escaped base64, a ragged array found after
        # a problem inside it, keys given twice deep in a skipped value, -0
        "escaped_base64.json": b'{"name":"e","tensors":{"t":{"data":"AAAAAAAA\\/wAAAAAA","shape":[3],"dtype":"f32"}}}',
        "ragged_inner.json": b'{"name":"r","tensors":{"t":[[1,2],[3,"x",5]]}}',
        "deep_duplicate.json": b'{"name":"d","path":"p","x":[{"a":1,"a":2}]}',
        "minus_zero.json": b'{"name":"z","scale":-0,"tensors":{"t":[[-0,0.0,-0.0]]}}',
        "nine_levels.json": b'{"name":"n","tensors":{"t":[[[[[[[[[1]]]]]]]]]}}',
    }


def adapter_upload_raw():
    a = f32(1, 2, 3, 4)
    peft = safetensors({LORA_A: ("F32", (2, 2), a), LORA_A.replace("lora_A", "lora_B"): ("F32", (2, 2), a)},
                       {"lora_alpha": "16", "r": "2", "format": "peft", "name": "from-meta", "use_rslora": "false"})
    pool = safetensors({"gate_up_lora_a": ("BF16", (1, 1, 2, 2), struct.pack("<4H", 0x3F80, 0, 0, 0x3F80))},
                       {"scale": "0.5", "format": "pool"})
    return {
        "peft.safetensors": peft,
        "pool.safetensors": pool,
        "empty.safetensors": safetensors({}),
        "query.bin": query(["name=q1", "r=4", "lora_alpha=8", "scale=0.5", "format=peft", "use_rslora=true",
                            "pinned=1", "strict=0", "replace=false"]) + peft,
        "query_validate.bin": query(["lora_alpha=1e-3", "format=auto"]) + pool,
        # near-valid
        "bad_r.bin": query(["name=a", "r=0"]) + peft,
        "bad_alpha_hex.bin": query(["name=a", "lora_alpha=0x10"]) + peft,
        "bad_alpha_inf.bin": query(["name=a", "scale=inf"]) + peft,
        "bad_format.bin": query(["name=a", "format=lora"]) + peft,
        "bad_name.bin": query(["name=.a"]) + peft,
        "bad_bool.bin": query(["name=a", "pinned=yes"]) + peft,
        "meta_bad_r.safetensors": safetensors({"x": ("F32", (1,), f32(1))}, {"r": "-1", "name": "a"}),
        "no_name.safetensors": safetensors({"x": ("F16", (2,), b"\0\0\0\0")}),
    }


def factor(shape, salt):
    """A float32 factor of small varied values."""
    n = 1
    for e in shape:
        n *= e
    return ("F32", shape, f32(*[((i * 7 + salt) % 11 - 5) / 8 for i in range(n)]))


def adapter_normalise():
    """Uploads for the normaliser's three servers: the gated n=1, H=8, F=4
    model (all-linear: up, down and the gate, the gate with its own rank;
    the gate alone) and the ungated n=2, H=4, F=3 one (fused PEFT, pool)."""
    q = "model.layers.%d.mlp.shared_expert."
    g = "model.layers.%d.mlp.shared_expert_gate."
    qwen = {}
    for l in (0, 1):
        qwen.update({q % l + "up_proj.lora_A.weight": factor((2, 8), l), q % l + "up_proj.lora_B.weight": factor((4, 2), 1),
                     q % l + "down_proj.lora_A.weight": factor((2, 4), 2),
                     q % l + "down_proj.lora_B.weight": factor((8, 2), 3),
                     g % l + "lora_A.weight": factor((3, 8), 4), g % l + "lora_B.weight": factor((1, 3), 5)})
    meta = {"r": "2", "lora_alpha": "4", "rank_pattern": js({"shared_expert_gate": 3}).decode(),
            "alpha_pattern": js({"shared_expert_gate": 6}).decode()}
    gate_only = {g % 0 + "lora_A.weight": factor((2, 8), 6), g % 0 + "lora_B.weight": factor((1, 2), 7)}
    s = "model.layers.0.mlp.shared_experts."
    fused = {s + "gate_up_proj.lora_A.weight": factor((2, 4), 1), s + "gate_up_proj.lora_B.weight": factor((12, 2), 2),
             s + "down_proj.lora_A.weight": factor((2, 6), 3), s + "down_proj.lora_B.weight": factor((4, 2), 4)}
    pool = {s + "gate_up_lora_a": factor((1, 2, 4, 4), 1), s + "gate_up_lora_b": factor((1, 2, 6, 2), 2),
            s + "down_lora_a": factor((1, 2, 2, 3), 3), s + "down_lora_b": factor((1, 2, 4, 2), 4)}
    return {
        "qwen_all_linear.safetensors": safetensors(qwen, meta),
        "qwen_gate_only.safetensors": safetensors(gate_only, {"r": "2", "lora_alpha": "2"}),
        "fused_peft.safetensors": safetensors(fused, {"r": "2", "lora_alpha": "2", "gate_up_order": "interleaved"}),
        "pool.safetensors": safetensors(pool, {"scale": "0.5", "format": "pool"}),
    }


PEFT = {
    "alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": "org/model", "bias": "none",
    "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True, "layers_pattern": None,
    "layers_to_transform": None, "lora_alpha": 16, "lora_dropout": 0.05, "modules_to_save": None,
    "peft_type": "LORA", "r": 8, "rank_pattern": {}, "revision": None,
    "target_modules": ["gate_proj", "up_proj", "down_proj"], "task_type": "CAUSAL_LM", "use_rslora": False,
}


def peft_config():
    return {
        "peft.json": json.dumps(PEFT, indent=2).encode(),
        "minimal.json": js({"r": 8, "lora_alpha": 16}),
        "rslora.json": js({"r": 1, "lora_alpha": 0.5, "use_rslora": True}),
        "nulls.json": js({"r": 4, "lora_alpha": 1e-3, "use_rslora": None}),
        # near-valid
        "r_real.json": b'{"r":8.0,"lora_alpha":16}',
        "r_string.json": js({"r": "8", "lora_alpha": 16}),
        "r_zero.json": js({"r": 0, "lora_alpha": 16}),
        "r_big.json": js({"r": 2**31, "lora_alpha": 16}),
        "alpha_missing.json": js({"r": 8}),
        "alpha_long_string.json": js({"r": 8, "lora_alpha": "x" * 100, "use_rslora": "yes"}),
        "alpha_overflow.json": b'{"r":8,"lora_alpha":1e400}',
        "array.json": js([PEFT]),
        "truncated.json": json.dumps(PEFT).encode()[:60],
        "duplicate.json": b'{"r":8,"r":8,"lora_alpha":16}',
        # a string of the file that is also the server's own words: not an echo
        "regress_own_words.json": js({"arrow_config": {"a": 1}, "x": "adapter config"}),
    }


def config():
    with open(os.path.join(ROOT, "config", "lorasink.example.json"), "rb") as f:
        example = f.read()
    return {
        "example.json": example,
        "empty.json": b"{}",
        "weights.json": js({"demo": False, "weights": "/models/w.safetensors", "w13_layout": "contiguous",
                            "dtype": "bf16"}),
        "seed_string.json": js({"seed": "18446744073709551615", "api_key": "secret-key", "port": 0,
                                "log_level": "debug", "device": "cpu", "cpu_isa": "avx2"}),
        "sizes.json": js({"experts": 64, "hidden": 65536, "layers": 1, "slots": 1, "max_rank": 1024,
                          "lora_layout": "per-expert", "batching": False}),
        # near-valid
        "unknown_key.json": js({"slot": 8}),
        "out_of_range.json": js({"port": 70000}),
        "demo_and_weights.json": js({"demo": True, "weights": "w.safetensors"}),
        "demo_off.json": js({"demo": False}),
        "wrong_type.json": js({"slots": "8", "batching": 1}),
        "bad_enum.json": js({"log_level": "loud"}),
        "empty_host.json": js({"host": ""}),
        "long_string.json": js({"adapter_dir": "d" * 5000}),
        "not_object.json": b"[1, 2]",
        "truncated.json": example[:50],
        # found by fuzz_config: jansson quoted the CR after the backslash
        # ("invalid escape near '...'") into the one-line error
        "regress_escape_cr.json": b'{"s\\\r:4\x01\x00\x00\x00}\xa4',
        "regress_unterminated_key.json": b'{"api_key": "s3cr3t\n',
    }


def api_keys():
    h1 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"  # sha256("test")
    h2 = "2CF24DBA5FB0A30E26E83B2AC5B9E29E1B161E5C1FA7425E73043362938B9824"  # sha256("hello"), upper case
    good = {"keys": [{"sha256": h1, "tenant": "acme", "role": "tenant", "max_adapters": 10, "rate": 50,
                      "max_pins": 2},
                     {"sha256": h2, "role": "admin"},
                     {"sha256": h1[::-1], "tenant": "acme-2_x", "role": "viewer", "rate": 0.25}]}
    return {
        "good.json": js(good),
        "empty.json": js({"keys": []}),
        # near-valid
        "unknown_key.json": js({"keys": [{"sha256": h1, "tenant": "a", "rol": "tenant"}]}),
        "unknown_top.json": js({"key": []}),
        "bad_hex.json": js({"keys": [{"sha256": h1[:63] + "g", "tenant": "a", "role": "tenant"}]}),
        "short_hex.json": js({"keys": [{"sha256": "00", "role": "admin"}]}),
        "duplicate_hash.json": js({"keys": [{"sha256": h1, "role": "admin"}, {"sha256": h1.upper(), "role": "admin"}]}),
        "duplicate_key.json": ('{"keys": [{"sha256": "%s", "sha256": "%s", "role": "admin"}]}' % (h1, h2)).encode(),
        "bad_role.json": js({"keys": [{"sha256": h1, "tenant": "a", "role": "owner"}]}),
        "bad_tenant.json": js({"keys": [{"sha256": h1, "tenant": "Acme/x", "role": "tenant"}]}),
        "no_tenant.json": js({"keys": [{"sha256": h1, "role": "viewer"}]}),
        "ranges.json": js({"keys": [{"sha256": h1, "tenant": "a", "role": "tenant", "max_adapters": -1,
                                     "rate": 0, "max_pins": 5000}]}),
        "not_object.json": b"[1, 2]",
        "truncated.json": js(good)[:80],
    }


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    for harness, cases in (("fuzz_forward_json", forward_json()), ("fuzz_forward_safetensors", forward_safetensors()),
                           ("fuzz_adapter_upload_json", adapter_upload_json()),
                           ("fuzz_adapter_upload_raw", adapter_upload_raw()),
                           ("fuzz_adapter_normalise", adapter_normalise()), ("fuzz_peft_config", peft_config()),
                           ("fuzz_config", config()), ("fuzz_api_keys", api_keys())):
        d = os.path.join(out, harness)
        os.makedirs(d, exist_ok=True)
        for name, data in cases.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print("%s: %d seeds, %d bytes" % (harness, len(cases), sum(map(len, cases.values()))))


if __name__ == "__main__":
    main()
