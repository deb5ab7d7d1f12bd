#!/usr/bin/env bash
# Installs, from Debian's packages, whatever lorasink needs that is not
# installed yet. Debian 12, as root (or with sudo).
#   scripts/install-deps.sh            what building and running the server needs (scripts/demo.sh)
#   scripts/install-deps.sh --test     that and what the test suite needs (scripts/test.sh)
#   scripts/install-deps.sh PKG...     these packages only (the checks that
#                                      need a tool of their own call it so)
set -euo pipefail
pkgs=(build-essential cmake pkg-config libmicrohttpd-dev libgnutls28-dev libjansson-dev libopenblas-dev curl python3)
test_pkgs=(libcmocka-dev libcurl4-openssl-dev clang libclang-rt-dev valgrind openssl)
if [ "${1:-}" = --test ]; then
  pkgs+=("${test_pkgs[@]}")
  shift
fi
[ "${LORASINK_BENCH_DEPS:-0}" = 1 ] && pkgs+=(wrk)
[ $# -gt 0 ] && pkgs=("$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  # Waits for another apt or dpkg to finish instead of failing on its lock.
  $sudo apt-get -o DPkg::Lock::Timeout=300 update -qq
  $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}"
fi
