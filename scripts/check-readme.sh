#!/usr/bin/env bash
# Checks what a new user pastes and follows: the README's "Try it" block
# run as it stands (on a free port instead of 8080, so it cannot collide
# with a server already there), examples/quickstart.sh run twice by it,
# and every link of the README and docs/ naming a file that exists in
# the repository (users have nothing outside it); and that demo.sh and
# wait-ready.sh fail in seconds on a taken port or an exited server.
# $1: the build dir the suite built (default build), reused by demo.sh.
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

out=$(mktemp)
trap 'rm -f "$out" "$out.log"' EXIT

# -- failing fast --------------------------------------------------------------
# A port another process holds (an older demo, say) stops demo.sh before it
# installs or builds anything, and wait-ready.sh gives up within a second
# of the server's exit, printing the end of its log.
busy=$(python3 tests/system/lsys.py free-port)
exec 4< <(exec python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("listening", flush=True); time.sleep(600)' "$busy")
holder=$!
read -r -u 4 _ || fail "could not hold a port for the port-taken check"
t0=$(date +%s)
if LORASINK_URL=http://127.0.0.1:$busy timeout 60 bash scripts/demo.sh >"$out" 2>&1; then
  fail "demo.sh started on a port already in use"
fi
kill "$holder" 2>/dev/null || true
grep -q "127.0.0.1:$busy is already in use" "$out" || { cat "$out"; fail "demo.sh did not say the port is taken"; }
[ $(($(date +%s) - t0)) -le 10 ] || fail "demo.sh took more than 10 s to refuse a taken port"
bash -c 'echo "error: the server could not start"; exit 3' >"$out.log" 2>&1 &
t0=$(date +%s)
if bash scripts/wait-ready.sh $! "$out.log" 60 >"$out" 2>&1; then fail "wait-ready.sh took an exited server as ready"; fi
grep -q "the server could not start" "$out" || { cat "$out"; fail "wait-ready.sh did not print the log's end"; }
[ $(($(date +%s) - t0)) -le 10 ] || fail "wait-ready.sh took more than 10 s to see the server exit"
# A server that says it listens on another port than LORASINK_URL names:
# said at once, not waited on for half an hour.
bash -c 'echo "listening on http://127.0.0.1:18402"; sleep 60' >"$out.log" 2>&1 &
stand_in=$!
t0=$(date +%s)
if LORASINK_URL=http://127.0.0.1:1 bash scripts/wait-ready.sh $stand_in "$out.log" 60 >"$out" 2>&1; then
  fail "wait-ready.sh took a server on another port as ready"
fi
kill "$stand_in" 2>/dev/null || true
grep -q "listens on http://127.0.0.1:18402 but LORASINK_URL is" "$out" || { cat "$out"; fail "wait-ready.sh did not name both ports"; }
[ $(($(date +%s) - t0)) -le 10 ] || fail "wait-ready.sh took more than 10 s to see the port differ"
# --port beside a LORASINK_URL of another port: wait-ready.sh and the
# examples would ask the wrong one, so demo.sh refuses before it builds.
if LORASINK_URL=http://127.0.0.1:1 timeout 60 bash scripts/demo.sh --port 2 >"$out" 2>&1; then
  fail "demo.sh took a --port that LORASINK_URL contradicts"
fi
grep -q "\-\-port 2 and LORASINK_URL=http://127.0.0.1:1 disagree" "$out" || { cat "$out"; fail "demo.sh did not name both ports"; }
rm -f "$out.log"
echo "PASS fail-fast: a taken port and a --port against LORASINK_URL refused by demo.sh, an exited server and a server on another port reported by wait-ready.sh, each in seconds"

# -- the Try it block --------------------------------------------------------
block=$(awk '/^## Try it/{on=1} on && /^```sh/{grab=1; next} grab && /^```/{exit} grab{print}' README.md)
[ -n "$block" ] || fail "no sh block under '## Try it' in README.md"
url_line='export LORASINK_URL=http://127.0.0.1:8080'
echo "$block" | grep -qx "$url_line" || fail "the Try it block does not start by giving LORASINK_URL ($url_line)"
if echo "$block" | grep -v -x "$url_line" | grep -q -E '8080|localhost'; then
  fail "the Try it block names the address beside LORASINK_URL"
fi
port=$(python3 tests/system/lsys.py free-port)
script=$(mktemp)
trap 'rm -f "$script" "$out" lorasink.log; rm -rf demo-checkpoint my-adapter; pkill -f "build/lorasink (--demo )?--port $port" || true' EXIT
{
  echo "set -e"
  # The block as it stands, on a free port: only its address line changes.
  echo "$block" | sed -e "s|^$url_line\$|export LORASINK_URL=http://127.0.0.1:$port|" \
    -e "s|bash examples/quickstart.sh\(.*\)|bash examples/quickstart.sh \&\& bash examples/quickstart.sh\1|"
  echo "wait"
} >"$script"
if ! timeout 1200 bash "$script" >"$out" 2>&1; then
  cat "$out"
  [ -f lorasink.log ] && tail -20 lorasink.log
  fail "the README's Try it block did not run as it stands"
fi
grep -q '"status":"ready"' "$out" || fail "the block never saw /ready"
grep -q '"source":"checkpoint"' "$out" || fail "the block's GET /model did not show the checkpoint it serves"
grep -q '"name":"mine","version":1,.*"format":"peft"' "$out" || fail "the block did not load its PEFT directory by path"
grep -q 'adapters used: mine v1 (slot' "$out" || fail "the block's mixed forward did not run through the adapter"
# Tokens 0 and 2 (the same x, both through "mine") agree; token 1, the base
# model, does not: the adapter changed the numbers it was asked to.
y0=$(sed -n 's/^y\[0\]\[:4\] = //p' "$out") y1=$(sed -n 's/^y\[1\]\[:4\] = //p' "$out") y2=$(sed -n 's/^y\[2\]\[:4\] = //p' "$out")
[ -n "$y0" ] && [ "$y0" = "$y2" ] && [ "$y0" != "$y1" ] ||
  fail "the block's forward: tokens 0 and 2 should match and differ from token 1 (y0 $y0, y1 $y1, y2 $y2)"
[ "$(grep -c '== delete one' "$out")" = 2 ] || fail "quickstart.sh did not run twice to its end"
grep -q ' info  stopped' lorasink.log || fail "the server did not stop cleanly on kill %1"
grep -q -- "--port $port" lorasink.log || grep -q "listening on http://127.0.0.1:$port" lorasink.log ||
  fail "the server did not listen on LORASINK_URL's port"
echo "PASS try-it: the README block ran as pasted, quickstart.sh twice, clean stop ($(($(date +%s) - start)) s)"
