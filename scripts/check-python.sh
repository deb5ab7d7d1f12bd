#!/usr/bin/env bash
# The Python client (clients/python) against the real server:
#   bash scripts/check-python.sh [BUILD_DIR]     (default: build)
# 1. numpy only: installs the package (a copy of clients/python, not
#    editable) into a venv of its own with numpy and safetensors and no
#    torch ($LORASINK_CLIENT_VENV, default ~/.cache/lorasink/venv-client;
#    made once per machine: about 100 MB and 20 s), and runs
#    clients/python/tests/test_client.py on that installed copy.
# 2. torch: runs clients/python/tests/test_torch.py (lorasink.torch in
#    tiny DeepSeek-V3 and Qwen2-MoE models, PEFT adapters) in the venv of
#    scripts/check-hf.sh, with its pins; when that venv is missing or
#    pinned otherwise, check-hf.sh runs first and makes it. Then
#    examples/transformers_remote.py, as docs/python.md runs it.
# Exit status 0 only when both passed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
export LORASINK_BIN=$BUILD/lorasink
[ -x "$LORASINK_BIN" ] || { echo "check-python: $LORASINK_BIN not found: build first" >&2; exit 1; }
export PYTHONDONTWRITEBYTECODE=1
cache=${XDG_CACHE_HOME:-$HOME/.cache}/lorasink
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
T0=$(date +%s)

# -- numpy only, the installed package ----------------------------------------
venv=${LORASINK_CLIENT_VENV:-$cache/venv-client}
reqs="numpy==2.4.6 safetensors==0.8.0 setuptools==84.2.1"
# shellcheck source=scripts/venv.sh
. "$ROOT/scripts/venv.sh"
ls_venv "$venv" "$reqs"
# Built from a copy: setuptools writes build/ and *.egg-info beside the
# sources it builds.
cp -r "$ROOT/clients/python" "$WORK/pkg"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall "$WORK/pkg"
T1=$(date +%s)
(cd "$WORK" && LORASINK_EXPECT_PACKAGED=1 "$venv/bin/python" -m unittest discover -s "$ROOT/clients/python/tests" \
  -p test_client.py)
echo "PASS client: the installed package, numpy only ($(($(date +%s) - T1)) s)"

# -- torch, transformers, peft: lorasink.torch ---------------------------------
hf=${LORASINK_HF_VENV:-$cache/venv-hf}
hf_reqs=$(sed -n 's/^reqs="\(.*\)"$/\1/p' "$ROOT/scripts/check-hf.sh")
[ -n "$hf_reqs" ] || { echo "check-python: no reqs= line in scripts/check-hf.sh" >&2; exit 1; }
if [ ! -f "$hf/stamp" ] || [ "$(cat "$hf/stamp")" != "$hf_reqs" ]; then
  echo "check-python: $hf is missing or pinned otherwise: running check-hf.sh, which makes it"
  LORASINK_HF_VENV=$hf bash "$ROOT/scripts/check-hf.sh" "$BUILD"
fi
T2=$(date +%s)
(cd "$WORK" && PYTHONPATH=$ROOT/clients/python/src "$hf/bin/python" -W ignore -m unittest discover \
  -s "$ROOT/clients/python/tests" -p test_torch.py) 2> >(grep -v "Writing model shards" >&2)
echo "PASS torch: lorasink.torch in DeepSeek-V3 and Qwen2-MoE, logits as PEFT's ($(($(date +%s) - T2)) s)"
T3=$(date +%s)
PYTHONPATH=$ROOT/clients/python/src "$hf/bin/python" "$ROOT/examples/transformers_remote.py" --lorasink "$LORASINK_BIN"
echo "PASS example: examples/transformers_remote.py ($(($(date +%s) - T3)) s)"
echo "check-python: passed ($(($(date +%s) - T0)) s, $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'))"
