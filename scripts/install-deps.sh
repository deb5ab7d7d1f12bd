#!/usr/bin/env bash
# Installs, from Debian's packages, whatever lorasink needs to build, test
# and run that is not installed yet. Debian 12, as root (or with sudo).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libmicrohttpd-dev libjansson-dev libopenblas-dev
      libcmocka-dev libcurl4-openssl-dev curl python3 clang libclang-rt-dev valgrind)
[ "${LORASINK_BENCH_DEPS:-0}" = 1 ] && pkgs+=(wrk)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
