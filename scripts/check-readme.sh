#!/usr/bin/env bash
# Checks what a new user pastes and follows: the README's "Try it" block
# run as it stands (on a free port instead of 8080, so it cannot collide
# with a server already there), examples/quickstart.sh run twice by it,
# and every link of the README and docs/ naming a file that exists in
# the repository (users have nothing outside it). $1: the build dir the
# suite built (default build), reused by demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
fail() { echo "check-readme: FAIL: $*"; exit 1; }

# -- links -------------------------------------------------------------------
for doc in README.md docs/*.md; do
  # [text](target): targets that are not URLs or anchors must exist.
  { grep -o '](\([^)]*\))' "$doc" || true; } | sed 's/^](\(.*\))$/\1/' | while read -r target; do
    case "$target" in http://* | https://* | mailto:* | '#'*) continue ;; esac
    path=${target%%#*}
    [ -e "$(dirname "$doc")/$path" ] || fail "$doc links to $target, which is not in the repository"
  done
done
if git ls-files -z | xargs -0 grep -l -E 'SPEC\.md|SPEC §|ARCHITECTURE\.md|\.\./shared' 2>/dev/null | grep -v '^scripts/check-readme.sh$'; then
  fail "the files above point at documents outside the repository"
fi
echo "PASS links: README.md and docs/ name only files in the repository"

# -- the Try it block --------------------------------------------------------
block=$(awk '/^## Try it/{on=1} on && /^```sh/{grab=1; next} grab && /^```/{exit} grab{print}' README.md)
[ -n "$block" ] || fail "no sh block under '## Try it' in README.md"
port=$(python3 tests/system/lsys.py free-port)
script=$(mktemp)
out=$(mktemp)
trap 'rm -f "$script" "$out" lorasink.log; rm -rf demo-checkpoint; pkill -f "build/lorasink (--demo )?--port $port" || true' EXIT
{
  echo "set -e"
  echo "export LORASINK_URL=http://127.0.0.1:$port"
  echo "$block" | sed -e "s|scripts/demo.sh|scripts/demo.sh --port $port|" -e "s|localhost:8080|localhost:$port|g" \
    -e "s|bash examples/quickstart.sh\(.*\)|bash examples/quickstart.sh \&\& bash examples/quickstart.sh\1|"
  echo "wait"
} >"$script"
if ! timeout 1200 bash "$script" >"$out" 2>&1; then
  cat "$out"
  [ -f lorasink.log ] && tail -20 lorasink.log
  fail "the README's Try it block did not run as it stands"
fi
grep -q '"status":"ready"' "$out" || fail "the block never saw /ready"
grep -q '"y":' "$out" || fail "the block's forward printed no y"
grep -q '"source":"checkpoint"' "$out" || fail "the block's GET /model did not show the checkpoint it serves"
[ "$(grep -c '== delete one' "$out")" = 2 ] || fail "quickstart.sh did not run twice to its end"
grep -q ' info  stopped' lorasink.log || fail "the server did not stop cleanly on kill %1"
echo "PASS try-it: the README block ran as pasted, quickstart.sh twice, clean stop ($(($(date +%s) - start)) s)"
