#!/usr/bin/env bash
# Checks the container images (docker/). Builds the CPU image with podman and
# checks a running container: /health, /ready, the image's HEALTHCHECK, a
# forward, an adapter loaded by path from a read-only mounted directory and a
# forward with it, the registry kept in the /state volume across a restart,
# and a clean exit 0 on SIGTERM. Then builds and runs every stage of
# docker/Dockerfile.cuda with Debian bases and LORASINK_CUDA=OFF, since the
# NVIDIA bases cannot be pulled here. Prints PASS/FAIL lines; exit 1 on any FAIL.
# Its Python steps (the mirror from apt's sources, the test adapter, the
# checks of y) are tests/system/check_image.py.
#
# Debian 12, as root. Needs no container registry: when the base image is
# missing it is made with debootstrap from the mirror apt uses, and kept, so
# a second run only rebuilds what changed.
#
# Settings (environment):
#   LORASINK_BASE_IMAGE     base of both stages (default: the Dockerfile's)
#   LORASINK_IMAGE          tag of the CPU image (default localhost/lorasink:cpu)
#   LORASINK_DEBIAN_MIRROR  mirror for debootstrap (default: read from apt's sources)
#   LORASINK_SKIP_CUDA_CHECK=1  skip the Dockerfile.cuda check
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE=${LORASINK_BASE_IMAGE:-docker.io/library/debian:bookworm-slim}
IMAGE=${LORASINK_IMAGE:-localhost/lorasink:cpu}
CUDA_CHECK_IMAGE=localhost/lorasink:cuda-file-check
H=1024 N=2 F=512 R=4   # the demo model's sizes, and the test adapter's rank
started=$SECONDS
failures=0

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
# A failure the later checks cannot run without.
die() { echo "FAIL $*"; echo "check-image: FAILED after $((SECONDS - started)) s"; exit 1; }

# --- what this needs ----------------------------------------------------------
# Root: debootstrap needs it, and rootless podman would keep its images and
# networks elsewhere and need user namespaces these machines may not allow.
[ "$(id -u)" -eq 0 ] || die "run as root"
bash scripts/install-deps.sh podman runc debootstrap curl python3 openssl

# Under /var/tmp: the base image's root tree may not fit a small tmpfs /tmp.
work=$(mktemp -d "${TMPDIR:-/var/tmp}/check-image.XXXXXX")
containers=()
cleanup() {
  local c
  for c in "${containers[@]}"; do
    podman rm -f -v "$c" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A private containers.conf, so /etc stays as it is: crun fails on these
# machines (setrlimit, hybrid cgroups), runc works once podman stops setting
# its default ulimits.
cat > "$work/containers.conf" <<'EOF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$work/containers.conf
# The build's RUN steps use the host's network: apt needs it, and a build
# container's own network would need what containers.conf above leaves out.
build_flags=(--runtime runc --network host --format docker)
# Where podman's complaints go: without systemd (these machines) it logs an
# error about the health check's timer on every start and stop. The timer
# never runs here; the checks run the health check themselves.
: >"$work/podman.log"

# --- the base image -------------------------------------------------------------
# The first bookworm URI in apt's sources, deb822 (*.sources) or one-line (*.list).
debian_mirror() {
  python3 tests/system/check_image.py mirror /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
    /etc/apt/sources.list.d/*.sources
}

if podman image exists "$BASE_IMAGE"; then
  pass "base image $BASE_IMAGE present, reused"
else
  mirror=${LORASINK_DEBIAN_MIRROR:-$(debian_mirror)} ||
    die "no bookworm mirror in /etc/apt/sources.list{,.d}; set LORASINK_DEBIAN_MIRROR"
  echo "check-image: making $BASE_IMAGE with debootstrap from $mirror"
  t=$SECONDS
  if ! debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1; then
    tail -n 30 "$work/debootstrap.log"
    die "debootstrap bookworm from $mirror"
  fi
  # The build stages run apt-get update themselves.
  rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
  if ! tar -C "$work/rootfs" -c . |
       podman import --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null 2>>"$work/podman.log"; then
    tail -n 20 "$work/podman.log"
    die "podman import of the debootstrap tree as $BASE_IMAGE"
  fi
  rm -rf "$work/rootfs"
  pass "base image $BASE_IMAGE made from $mirror in $((SECONDS - t)) s"
fi

# --- helpers --------------------------------------------------------------------
free_port() {
  python3 tests/system/check_image.py free-port
}

# http METHOD URL [BODY_FILE]: prints the status code; the body lands in $work/body.
http() {
  local args=(-s -o "$work/body" -w '%{http_code}' -X "$1" --max-time 30)
  [ $# -ge 3 ] && args+=(-H 'Content-Type: application/json' --data-binary "@$3")
  curl "${args[@]}" "$2" || true
}

# wait_ready NAME URL: until /ready answers 200, while the container runs (60 s at most).
wait_ready() {
  local code
  for _ in $(seq 1 120); do
    code=$(http GET "$2/ready")
    [ "$code" = 200 ] && return 0
    if [ "$(podman inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" != true ]; then
      podman logs "$1" 2>&1 | tail -n 20
      echo "check-image: container $1 exited"
      return 1
    fi
    sleep 0.5
  done
  podman logs "$1" 2>&1 | tail -n 20
  return 1
}

# stop_clean NAME WHAT: SIGTERM (podman stop) must end it with exit 0 within
# 5 s and a log of the graceful stop; podman would SIGKILL it after 10 s.
stop_clean() {
  local t0 t1 ms code
  t0=$(date +%s%N)
  podman stop -t 10 "$1" >/dev/null 2>>"$work/podman.log"
  t1=$(date +%s%N)
  ms=$(((t1 - t0) / 1000000))
  code=$(podman inspect -f '{{.State.ExitCode}}' "$1")
  if [ "$code" = 0 ] && [ "$ms" -lt 5000 ]; then
    pass "$2: podman stop (SIGTERM) -> exit 0 in $ms ms"
  else
    fail "$2: podman stop (SIGTERM) -> exit $code in $ms ms (want 0 within 5000 ms)"
  fi
  podman logs "$1" >"$work/server.log" 2>&1
  if grep -q 'SIGTERM: stopping' "$work/server.log" && grep -Eq 'info +stopped$' "$work/server.log"; then
    pass "$2: log shows the graceful shutdown"
  else
    tail -n 10 "$work/server.log"
    fail "$2: log lacks 'SIGTERM: stopping' ... 'stopped'"
  fi
}

# --- test data: a forward body and a PEFT adapter directory -----------------------
# The adapter directory is mounted read-only and read by uid 10001, not root.
mkdir -p "$work/adapters/demo"
python3 tests/system/check_image.py data "$work" "$H" "$N" "$F" "$R"
chmod 755 "$work/adapters" "$work/adapters/demo"
chmod 644 "$work"/adapters/demo/*

# check_y WHAT FILE: the reply body holds y of 2 x H finite numbers.
check_y() {
  if python3 tests/system/check_image.py check-y "$work/body" "$H"
  then pass "$1: y is [2][$H]"; cp "$work/body" "$2"
  else fail "$1: y is not [2][$H]: $(head -c 300 "$work/body")"; fi
}

# serve_checks NAME URL WHAT: the checks every image's running container passes.
serve_checks() {
  local code out probe
  code=$(http GET "$2/health")
  if [ "$code" = 200 ]; then pass "$3: GET /health 200"; else fail "$3: GET /health $code"; fi
  code=$(http GET "$2/ready")
  if [ "$code" = 200 ]; then pass "$3: GET /ready 200 $(cat "$work/body")"; else fail "$3: GET /ready $code"; fi
  if out=$(podman healthcheck run "$1" 2>&1); then
    pass "$3: HEALTHCHECK reports healthy"
  else
    fail "$3: HEALTHCHECK: $out"
  fi
  # The same probe aimed at a port nothing listens on must fail, or a
  # "healthy" above would prove nothing.
  if ! probe=$(podman inspect -f '{{index .Config.Healthcheck.Test 1}}' "$1" 2>/dev/null) || [ -z "$probe" ]; then
    fail "$3: no HEALTHCHECK command to probe with"
  elif podman exec -e LORASINK_PORT=1 "$1" sh -c "$probe" >/dev/null 2>&1; then
    fail "$3: the HEALTHCHECK probe passes with no server on its port"
  else
    pass "$3: the HEALTHCHECK probe fails with no server on its port"
  fi
  code=$(podman exec "$1" id -u 2>&1) || true
  if [ "$code" = 10001 ]; then pass "$3: server runs as uid 10001"; else fail "$3: server runs as uid '$code', want 10001"; fi
}

# --- the CPU image -----------------------------------------------------------------
t=$SECONDS
if ! podman build "${build_flags[@]}" --build-arg BASE_IMAGE="$BASE_IMAGE" \
     -f docker/Dockerfile -t "$IMAGE" . >"$work/build.log" 2>&1; then
  tail -n 40 "$work/build.log"
  die "podman build -f docker/Dockerfile"
fi
pass "built $IMAGE in $((SECONDS - t)) s ($(podman image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1 / 1e6}'))"

# What the image says about itself.
meta=$(podman image inspect -f '{{.Config.User}}|{{json .Config.ExposedPorts}}|{{.Config.StopSignal}}|{{json .Config.Volumes}}|{{json .Config.Env}}|{{json .Config.Healthcheck}}' "$IMAGE")
IFS='|' read -r user ports stopsig volumes envs health <<<"$meta"
if [ "$user" = 10001:10001 ]; then pass "image user $user"; else fail "image user '$user', want 10001:10001"; fi
if [[ $ports == *'"8080/tcp"'* ]]; then pass "image exposes 8080/tcp"; else fail "image exposes $ports"; fi
if [ "$stopsig" = SIGTERM ]; then pass "image stop signal SIGTERM"; else fail "image stop signal '$stopsig'"; fi
missing_vol=""
for v in /adapters /weights /state; do
  [[ $volumes == *"\"$v\""* ]] || missing_vol+=" $v"
done
if [ -z "$missing_vol" ]; then pass "image volumes $volumes"; else fail "image lacks volumes$missing_vol ($volumes)"; fi
missing_env=""
for e in LORASINK_HOST=0.0.0.0 LORASINK_PORT=8080 LORASINK_ADAPTER_DIR=/adapters LORASINK_STATE_DIR=/state; do
  [[ $envs == *"\"$e\""* ]] || missing_env+=" $e"
done
if [ -z "$missing_env" ]; then pass "image env sets host 0.0.0.0, port 8080, /adapters, /state"; else fail "image env lacks$missing_env"; fi
if [[ $health == *'lorasink --probe'* ]]; then pass "image HEALTHCHECK runs lorasink --probe"; else fail "image HEALTHCHECK: $health"; fi
if podman run --rm --entrypoint ldd "$IMAGE" /usr/local/bin/lorasink >"$work/ldd" 2>>"$work/podman.log" &&
   ! grep -Eq 'not found|openblas|cuda|cublas' "$work/ldd"; then
  pass "runtime links only $(awk '/=>/ {printf "%s ", $1}' "$work/ldd")"
else
  fail "runtime libraries: $(cat "$work/ldd")"
fi

# The server listens on 8080 inside the container's own network; the host
# reaches it through a published port on the loopback address.
port=$(free_port)
url=http://127.0.0.1:$port
cpu=lorasink-check-$$
containers+=("$cpu")
podman run -d --name "$cpu" -p "127.0.0.1:$port:8080" -v "$work/adapters:/adapters:ro" "$IMAGE" \
  >/dev/null 2>>"$work/podman.log" ||
  die "podman run $IMAGE"
t=$SECONDS
wait_ready "$cpu" "$url" || die "cpu: /ready never answered 200 on $url"
pass "cpu: ready on $url in $((SECONDS - t)) s"
serve_checks "$cpu" "$url" cpu

code=$(http POST "$url/forward" "$work/forward.json")
if [ "$code" = 200 ]; then check_y "cpu: POST /forward 200" "$work/y-base"; else fail "cpu: POST /forward $code $(head -c 300 "$work/body")"; fi

code=$(http POST "$url/adapters" "$work/load-a.json")
if [ "$code" = 201 ]; then
  pass "cpu: POST /adapters {name: a, path: demo} from the mounted /adapters -> 201"
else
  fail "cpu: POST /adapters by path -> $code $(head -c 400 "$work/body")"
fi
code=$(http POST "$url/forward" "$work/forward-a.json")
if [ "$code" = 200 ]; then
  check_y "cpu: POST /forward with adapter a 200" "$work/y-a"
  if [ -f "$work/y-base" ] && [ -f "$work/y-a" ] &&
     python3 tests/system/check_image.py differ "$work/y-base" "$work/y-a"; then
    pass "cpu: adapter a changes y"
  else
    fail "cpu: adapter a leaves y as the base model's"
  fi
else
  fail "cpu: POST /forward with adapter a -> $code $(head -c 300 "$work/body")"
fi

stop_clean "$cpu" cpu

# The anonymous /state volume outlives a stop: the restarted server restores a.
if podman start "$cpu" >/dev/null 2>>"$work/podman.log" && wait_ready "$cpu" "$url" &&
   [ "$(http GET "$url/adapters/a")" = 200 ]; then
  pass "cpu: after a restart adapter a is restored from the /state volume"
else
  fail "cpu: after a restart GET /adapters/a: $(head -c 300 "$work/body")"
fi
podman stop -t 10 "$cpu" >/dev/null 2>>"$work/podman.log" || true

# TLS in the server: the same HEALTHCHECK asks /ready over HTTPS with the
# files the environment names, so the container turns healthy.
mkdir -p "$work/tls"
if openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost -keyout "$work/tls/tls.key" \
     -out "$work/tls/tls.crt" >"$work/openssl.log" 2>&1; then
  chmod 0644 "$work/tls/tls.key" # the server's uid 10001 reads it through the read-only mount
  port=$(free_port)
  tls=lorasink-check-tls-$$
  containers+=("$tls")
  podman run -d --name "$tls" -p "127.0.0.1:$port:8443" -v "$work/tls:/tls:ro" -e LORASINK_PORT=8443 \
    -e LORASINK_TLS_CERT=/tls/tls.crt -e LORASINK_TLS_KEY=/tls/tls.key "$IMAGE" >/dev/null 2>>"$work/podman.log" ||
    die "podman run $IMAGE with TLS"
  healthy=0
  for _ in $(seq 1 120); do
    if podman healthcheck run "$tls" >/dev/null 2>&1; then healthy=1; break; fi
    sleep 0.5
  done
  code=$(curl -sk -o /dev/null -w '%{http_code}' --max-time 10 "https://127.0.0.1:$port/ready" || true)
  if [ "$healthy" = 1 ] && [ "$code" = 200 ]; then
    pass "tls: HEALTHCHECK reports healthy over HTTPS (GET /ready $code through the published port)"
  else
    fail "tls: HEALTHCHECK healthy=$healthy, GET https /ready $code; $(podman logs "$tls" 2>&1 | tail -n 5)"
  fi
  podman stop -t 10 "$tls" >/dev/null 2>>"$work/podman.log" || true
else
  fail "tls: openssl could not make a certificate: $(tail -n 3 "$work/openssl.log")"
fi

# --- docker/Dockerfile.cuda, without NVIDIA's images --------------------------------
# Its defaults must still name NVIDIA's devel and runtime images of one CUDA version...
if [ "${LORASINK_SKIP_CUDA_CHECK:-0}" != 1 ]; then
  if grep -Eq '^ARG BUILD_BASE=docker.io/nvidia/cuda:\$\{CUDA_VERSION\}-devel-' docker/Dockerfile.cuda &&
     grep -Eq '^ARG RUNTIME_BASE=docker.io/nvidia/cuda:\$\{CUDA_VERSION\}-runtime-' docker/Dockerfile.cuda &&
     grep -Eq '^ARG LORASINK_CUDA=ON$' docker/Dockerfile.cuda; then
    pass "cuda file: defaults are NVIDIA's devel/runtime bases of one CUDA version, LORASINK_CUDA=ON"
  else
    fail "cuda file: default bases or LORASINK_CUDA=ON changed"
  fi
  # ...and every stage must build and serve with Debian bases and CUDA off:
  # the syntax, the copied folders, the packages (one name on Debian 12 and
  # Ubuntu 22.04), the configure and link, the user, the health check.
  t=$SECONDS
  if podman build "${build_flags[@]}" --build-arg BUILD_BASE="$BASE_IMAGE" --build-arg RUNTIME_BASE="$BASE_IMAGE" \
       --build-arg LORASINK_CUDA=OFF -f docker/Dockerfile.cuda -t "$CUDA_CHECK_IMAGE" . >"$work/build-cuda.log" 2>&1; then
    pass "cuda file: every stage builds with $BASE_IMAGE and LORASINK_CUDA=OFF in $((SECONDS - t)) s"
    if podman image inspect -f '{{json .Config.Env}}' "$CUDA_CHECK_IMAGE" | grep -q '"LORASINK_DEVICE=cuda"'; then
      pass "cuda file: the image asks for LORASINK_DEVICE=cuda"
    else
      fail "cuda file: the image does not set LORASINK_DEVICE=cuda"
    fi
    port=$(free_port)
    cuda_url=http://127.0.0.1:$port
    cuda=lorasink-check-cuda-$$
    containers+=("$cuda")
    # LORASINK_DEVICE=cpu: the image asks for cuda, which this build lacks.
    if podman run -d --name "$cuda" -p "127.0.0.1:$port:8080" -e LORASINK_DEVICE=cpu \
         -v "$work/adapters:/adapters:ro" "$CUDA_CHECK_IMAGE" >/dev/null 2>>"$work/podman.log" &&
       wait_ready "$cuda" "$cuda_url"; then
      serve_checks "$cuda" "$cuda_url" "cuda file"
      stop_clean "$cuda" "cuda file"
    else
      fail "cuda file: the container never answered /ready 200"
    fi
  else
    tail -n 40 "$work/build-cuda.log"
    fail "cuda file: podman build -f docker/Dockerfile.cuda with Debian bases"
  fi
fi

if [ "$failures" -gt 0 ]; then
  echo "check-image: $failures FAILED, $((SECONDS - started)) s"
  exit 1
fi
echo "check-image: all passed in $((SECONDS - started)) s"
