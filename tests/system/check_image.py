"""The Python steps of scripts/check-image.sh (which drives podman):
  check_image.py mirror SOURCES...        the first bookworm URI in apt's
                                          sources, deb822 or one-line
  check_image.py data WORK H N F R        the test adapter directory and
                                          the forward and load bodies
  check_image.py check-y BODY H           exit 0 when BODY's y is [2][H] finite
  check_image.py differ A B               exit 0 when the y of A and B differ
  check_image.py free-port                a loopback port nothing listens on"""
import json
import math
import os
import re
import sys

import lsys


def mirror(paths):
    for path in paths:
        if not os.path.isfile(path):
            continue
        text = open(path, encoding="utf-8", errors="replace").read()
        if path.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields = {}
                for line in stanza.splitlines():
                    m = re.match(r"([A-Za-z-]+):\s*(.*)", line)
                    if m:
                        fields[m.group(1).lower()] = m.group(2).split()
                if "deb" in fields.get("types", []) and "bookworm" in fields.get("suites", []) \
                   and fields.get("enabled", ["yes"])[0] != "no" and fields.get("uris"):
                    print(fields["uris"][0])
                    return 0
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb" and words[2] == "bookworm":
                    print(words[1])
                    return 0
    return 1


def data(work, H, n, F, r):
    # The adapter directory is mounted read-only and read by uid 10001.
    tensors = lsys.shared_expert_lora([0], H, n, F, r, lambda l, s, i, j: ((i * 7 + j * 3 + s + 1) % 13 - 6) / 256.0)
    d = os.path.join(work, "adapters", "demo")
    lsys.write_safetensors(os.path.join(d, "adapter_model.safetensors"), tensors)
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump({"r": r, "lora_alpha": 8}, f)
    x = [[((t * 5 + i) % 17 - 8) / 8.0 for i in range(H)] for t in range(2)]
    for name, body in (("forward.json", {"layer": 0, "x": x}), ("forward-a.json", {"layer": 0, "x": x, "adapter": "a"}),
                       ("load-a.json", {"name": "a", "path": "demo"})):
        with open(os.path.join(work, name), "w") as f:
            json.dump(body, f)
    return 0


def check_y(body, H):
    y = json.load(open(body))["y"]
    return 0 if len(y) == 2 and all(len(row) == H and all(math.isfinite(v) for v in row) for row in y) else 1


def differ(a, b):
    ya, yb = (json.load(open(f))["y"] for f in (a, b))
    return 0 if ya != yb else 1


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "mirror":
        return mirror(args)
    if cmd == "data":
        return data(args[0], *map(int, args[1:5]))
    if cmd == "check-y":
        return check_y(args[0], int(args[1]))
    if cmd == "differ":
        return differ(args[0], args[1])
    if cmd == "free-port":
        print(lsys.free_port())
        return 0
    sys.exit("check_image.py: unknown step " + cmd)


if __name__ == "__main__":
    sys.exit(main())
