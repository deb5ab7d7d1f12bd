#!/usr/bin/env bash
# lorasink against the real transformers and peft libraries:
#   bash scripts/check-hf.sh [BUILD_DIR]     (default: build)
# Installs torch, transformers, peft, safetensors and numpy from PyPI into
# .venv-hf/ (once; PyPI's torch wheel pulls its nvidia-* packages, about
# 5.6 GB and 4 minutes here, and does not import without them), then runs
# tests/hf/check_hf.py: tiny DeepSeek-V3 and Qwen2-MoE models saved by
# transformers, LoRA adapters on their shared experts saved by peft, served
# by BUILD_DIR/lorasink and compared with the modules' own forward.
# Exit status 0 only when every family passed. The last result is in
# docs/adapters.md ("Checked against transformers and peft").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
BIN=$BUILD/lorasink
[ -x "$BIN" ] || { echo "check-hf: $BIN not found: build first" >&2; exit 1; }
T0=$(date +%s)
venv=$ROOT/.venv-hf
reqs="torch transformers peft safetensors numpy"
if [ ! -f "$venv/stamp" ] || [ "$(cat "$venv/stamp")" != "$reqs" ]; then
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt-get update -q >/dev/null && apt-get install -y -q python3-venv >/dev/null
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check $reqs
  echo "$reqs" >"$venv/stamp"
  echo "check-hf: installed $reqs into .venv-hf ($(du -sh "$venv" | cut -f1), $(($(date +%s) - T0)) s)"
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
T1=$(date +%s)
"$venv/bin/python" "$ROOT/tests/hf/check_hf.py" "$BIN" "$WORK" 2> >(grep -v "Writing model shards" >&2)
echo "check-hf: passed ($(($(date +%s) - T1)) s, $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'))"
