#!/usr/bin/env bash
# Lints the Python of the system checks and of what users run: tests/system/,
# tests/fuzz/, tests/hf/, bench/soak.py, bench/bench_names.py, examples/ and
# scripts/ (pyflakes: syntax errors, undefined and unused names, no style
# opinions). Installs Debian's python3-pyflakes when missing. Exit status 0
# only when clean.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh python3-pyflakes
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- 'tests/system/*.py' 'tests/fuzz/*.py' \
  'tests/hf/*.py' bench/soak.py bench/bench_names.py 'examples/*.py' 'scripts/*.py')
[ ${#files[@]} -gt 0 ] || { echo "check-pyflakes: no Python files found" >&2; exit 1; }
pyflakes3 "${files[@]}"
echo "PASS pyflakes: ${#files[@]} files clean"
