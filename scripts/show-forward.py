#!/usr/bin/env python3
"""Prints a /forward JSON reply (read from stdin) in a few lines: each
token's first values of y, and the adapters that served it; an error
reply is printed as it came, and the exit status is then 1. For the
README's Try it, where y is thousands of numbers.

    curl -s $LORASINK_URL/forward -d @body.json | python3 scripts/show-forward.py
"""
import json
import sys


def main():
    text = sys.stdin.read()
    try:
        reply = json.loads(text)
    except ValueError:
        print(text.strip() or "(no reply)")
        return 1
    if "y" not in reply:
        print(json.dumps(reply))
        return 1
    y = reply["y"]
    for t, row in enumerate(y):
        print(f"y[{t}][:4] = {[float(f'{v:.6g}') for v in row[:4]]}")
    used = ", ".join(f"{a['name']} v{a['version']} (slot {a['slot']})" for a in reply.get("adapters", []))
    print(f"layer {reply.get('layer')}, {reply.get('tokens')} tokens, {len(y[0]) if y else 0} values each; "
          f"adapters used: {used or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
