#!/usr/bin/env python3
"""The request bodies examples/quickstart.sh sends, written into DIR:
    python3 examples/quickstart_data.py DIR H N F
inline.json (a rank-4 PEFT adapter for layer 0 as JSON tensors, small
deterministic values), adapter.safetensors (the same factors as a raw
safetensors body, lora_alpha 16 in __metadata__) and forward.json (three
tokens: inline-demo, the base model, raw-demo). Only the standard library
and the repository's safetensors writer (tests/system/lsys.py)."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "system"))
import lsys  # noqa: E402 - the repository's one safetensors writer

out, H, n, F = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r = 4
tensors = lsys.shared_expert_lora([0], H, n, F, r, lambda l, s, i, j: ((i * 7 + j * 3 + s + 1) % 13 - 6) / 256.0)
# JSON tensors are nested lists: rows of the flat values.
rows = {name: [vals[i * shape[1]:(i + 1) * shape[1]] for i in range(shape[0])]
        for name, (shape, vals) in tensors.items()}
with open(os.path.join(out, "inline.json"), "w") as f:
    json.dump({"name": "inline-demo", "replace": True, "config": {"r": r, "lora_alpha": 8}, "tensors": rows}, f)
lsys.write_safetensors(os.path.join(out, "adapter.safetensors"), tensors, {"lora_alpha": "16"})
x = [[((t * 5 + i) % 17 - 8) / 8.0 for i in range(H)] for t in range(3)]
with open(os.path.join(out, "forward.json"), "w") as f:
    json.dump({"x": x, "adapters": ["inline-demo", None, "raw-demo"]}, f)
