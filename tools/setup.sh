# Shared set-up for tools/demo and tools/test (sourced, not run): install the Debian packages
# the build needs (as root: apt-get update first; otherwise print the exact command), then
# configure and build one build tree.
#   zero_setup <build-dir> [extra cmake args...]
set -euo pipefail

ZERO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# What outlives a clone: ccache's objects and the TSan-built oneTBB (tools/sanitize), in the
# user's cache directory (ccache's own default place), so that a fresh clone on a machine that
# built zero before compiles only what changed. CCACHE_BASEDIR makes the clone's path irrelevant
# to ccache's hashes. ZERO_CACHE_DIR / CCACHE_DIR override.
ZERO_CACHE="${ZERO_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-$ZERO_ROOT}/.cache}/zero}"
export CCACHE_DIR="${CCACHE_DIR:-$ZERO_CACHE/ccache}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ZERO_ROOT}"
# -g puts the compile's directory into each object, and ccache then hashes it too, so two
# checkouts of one commit (a clone, a worktree) shared 6 of 927 objects; without it they share
# every object whose source and flags match (a hit's debug info names the other checkout's build
# directory; the sources' paths are relative to it either way). tools/fuzz set it already.
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
ZERO_PACKAGES=(cmake ninja-build g++ ccache libgtest-dev libgmock-dev libbenchmark-dev libtbb-dev
               libopenmpi-dev openmpi-bin nlohmann-json3-dev liburing-dev
               libxxhash-dev pkg-config libcli11-dev)

zero_install_packages() {
  local missing=()
  for p in "${ZERO_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  if [[ $(id -u) -eq 0 ]]; then
    echo "[zero] installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "[zero] missing Debian packages; run as root:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
}

# Python's safetensors + numpy, which the checkpoint import tests write their files with
# (tests/ckpt/write_safetensors.py), in a venv under .cache/pyvenv: made and filled once (PyPI),
# then left as it is. tools/test calls it (the main job, tools/demo, does not need it).
zero_python_venv() {
  local venv="$ZERO_ROOT/.cache/pyvenv"
  if [[ -x "$venv/bin/python3" ]] && "$venv/bin/python3" -c "import safetensors, numpy" 2>/dev/null; then
    return 0
  fi
  echo "[zero] installing safetensors and numpy into $venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python3" -m pip install -q --disable-pip-version-check safetensors numpy
}

# How many tests ctest runs at once: twice the cores. Much of the suite waits rather than computes
# (MPI start-up, collectives between threads of one process, subprocesses, checkpoint I/O), and
# its time bounds hold on a loaded machine (tests/common/load_slack.hpp, ZERO_TEST_TIMEOUT_SCALE),
# so a second test per core fills those waits. ZERO_CTEST_JOBS overrides.
zero_ctest_jobs() {
  echo "${ZERO_CTEST_JOBS:-$((2 * $(nproc)))}"
}

zero_setup() {
  local build_dir="$1"
  shift
  zero_install_packages
  # The CUDA toolkit, when installed, lives here; with nvcc found the CUDA sources are built too.
  if [[ -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  local jobs
  jobs="$(nproc)"
  cmake -S "$ZERO_ROOT" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$build_dir" -j "$jobs"
}
