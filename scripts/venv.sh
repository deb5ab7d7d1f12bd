# shellcheck shell=bash
# Sourced by the check scripts: ls_venv DIR "PKG==V ..." makes DIR a venv
# holding exactly those pins, reinstalled only when the list changes (its
# stamp file). A lock beside it makes two runs sharing one venv (a user's
# and CI's in ~/.cache/lorasink) wait for each other instead of deleting
# each other's half-made install.
ls_venv() {
  local venv=$1 reqs=$2 t0
  t0=$(date +%s)
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
  if [ ! -f "$venv/stamp" ] || [ "$(cat "$venv/stamp")" != "$reqs" ]; then
    command -v python3 >/dev/null || { echo "venv: python3 is missing" >&2; return 1; }
    # Debian's python3 makes venvs only with python3-venv (ensurepip).
    if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
      apt-get update -q >/dev/null && apt-get install -y -q python3-venv >/dev/null
    fi
    rm -rf "$venv"
    python3 -m venv "$venv"
    # shellcheck disable=SC2086 # one word a package
    "$venv/bin/pip" install -q --disable-pip-version-check $reqs
    echo "$reqs" >"$venv/stamp"
    echo "venv: installed $reqs into $venv ($(du -sh "$venv" | cut -f1), $(($(date +%s) - t0)) s)"
  fi
  flock -u 9
  exec 9>&-
}
