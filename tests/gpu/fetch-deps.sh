#!/usr/bin/env bash
# Downloads, here, the Debian packages that tests/gpu/check.sh unpacks on a
# device machine that cannot reach a package registry, into .gpu-deps/
# (ignored by git; name it in the device tool's carry list). libcurl's
# SSH and LDAP libraries are listed too: the device image (Ubuntu 24.04)
# has other versions, and the tests that link libcurl need these to link.
# libgnutls28-dev without its library: the image's libgnutls.so.30 (which
# its libmicrohttpd needs too) is what the server links (check.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu-deps
cd .gpu-deps
apt-get download libmicrohttpd-dev libmicrohttpd12 libjansson-dev libjansson4 libopenblas-dev \
  libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libcmocka-dev libcmocka0 \
  libcurl4-openssl-dev libcurl4 libssh2-1 libldap-2.5-0 libsasl2-2 libsasl2-modules-db \
  pkgconf pkgconf-bin libpkgconf3 libgnutls28-dev
ls -la
