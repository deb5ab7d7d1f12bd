#!/usr/bin/env bash
# lorasink against the real transformers and peft libraries:
#   bash scripts/check-hf.sh [BUILD_DIR [NAME...]]     (default: build, every entry)
# Installs torch, transformers, peft, safetensors and numpy from PyPI, at
# the versions last checked, into a venv kept outside the clone
# ($LORASINK_HF_VENV, default ~/.cache/lorasink/venv-hf: once per machine,
# not once per clone; PyPI's torch wheel pulls its nvidia-* packages,
# about 5.6 GB and 4 minutes here, and does not import without them), then runs
# tests/hf/check_hf.py: a tiny model of every family lorasink serves that
# transformers can build, saved by transformers, LoRA adapters on its shared
# experts saved by peft, served by BUILD_DIR/lorasink and compared with the
# modules' own forward (about 20 s). Names after BUILD_DIR run only those
# entries of check_hf.py's FAMILIES. Exit status 0 only when every family
# passed. The last result is in docs/adapters.md ("Checked against
# transformers and peft").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
shift || true
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
BIN=$BUILD/lorasink
[ -x "$BIN" ] || { echo "check-hf: $BIN not found: build first" >&2; exit 1; }
venv=${LORASINK_HF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/lorasink/venv-hf}
# Pinned: a new release of any of them may change what it saves or how it
# computes; moving a pin is a change of its own, with the check rerun.
reqs="torch==2.15.0 transformers==5.24.0 peft==0.21.2 safetensors==0.8.0 numpy==2.4.6"
# shellcheck source=scripts/venv.sh
. "$ROOT/scripts/venv.sh"
ls_venv "$venv" "$reqs"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
T1=$(date +%s)
"$venv/bin/python" "$ROOT/tests/hf/check_hf.py" "$BIN" "$WORK" "$@" 2> >(grep -v "Writing model shards" >&2)
echo "check-hf: passed ($(($(date +%s) - T1)) s, $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'))"
