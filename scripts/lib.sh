# Shared by scripts/run and scripts/test: install what is missing, configure and build.
# Sourced, not run. Uses only Debian's packages.
set -euo pipefail

ATTN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Build and test dependencies (Debian 12 package names).
# pybind11-dev, python3-dev and python3-pybind11 build the Python module (bench/python, `import attnbench`)
# for Debian's python3.
ATTN_BUILD_PACKAGES=(g++ cmake ninja-build git pkg-config libeigen3-dev libopenblas-dev libopenblas0-pthread
  libtbb-dev nlohmann-json3-dev catch2 libcli11-dev libhwy-dev libbenchmark-dev pybind11-dev python3-dev
  python3-pybind11 libopenmpi-dev openmpi-bin)
# OpenMPI (above) builds attnbench_mpi, ring attention across ranks (bench/mpi, ctest label mpi). The sharded
# sweep test (tests/slurm, ctest label slurm) starts a one-node Slurm: scripts/slurm/local-cluster.
ATTN_SLURM_PACKAGES=(slurm-wlm slurmctld slurmd slurm-client munge)
# Plots and the numpy/PyTorch interoperability tests run with Debian's python (/usr/bin/python3).
ATTN_PYTHON_PACKAGES=(python3 python3-numpy python3-matplotlib)
ATTN_TORCH_PACKAGES=(python3-torch)
# Sanitizer builds (ThreadSanitizer) and libFuzzer targets use Debian's clang 14 and its runtime libraries;
# llvm-14 provides llvm-symbolizer for readable sanitizer stack traces.
ATTN_CLANG_PACKAGES=(clang-14 libclang-rt-14-dev llvm-14)

attn_log() { printf '[attnbench] %s\n' "$*" >&2; }

# Installs the named Debian packages that are not installed yet (as root, or through passwordless sudo).
attn_ensure_packages() {
  local missing=()
  for p in "$@"; do
    # Installed for this machine's architecture (or arch-independent): an :arm64 copy from the cross build
    # (scripts/cross-test) must not count for the amd64 package of the same name.
    local arch="${p#*:}"
    [ "$arch" = "$p" ] && arch="$(dpkg --print-architecture)"
    dpkg-query -W -f='${Status} ${Architecture}\n' "${p%%:*}" 2>/dev/null |
      grep -qE "^install ok installed ($arch|all)\$" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo)
    else
      attn_log "missing Debian packages: ${missing[*]}"
      attn_log "not root and no passwordless sudo: install them with 'apt-get install ${missing[*]}' and rerun"
      exit 3
    fi
  fi
  attn_log "installing: ${missing[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# attn_blas_env ATTNBENCH: where OpenBLAS does not recognise the CPU and falls back to narrower kernels
# (Debian 12's 0.3.21 runs Emerald Rapids on its SSE3 Prescott ones, sgemm 8x slower), attnbench re-executes
# itself with OPENBLAS_CORETYPE set (common/support/runtime.hpp); this exports the same setting for what a
# script starts besides attnbench (PyTorch and the Python module, the peer runner, ctest's other children),
# saying so once. Nothing when OPENBLAS_CORETYPE is already set or ATTN_BLAS_AUTOCORE=0.
attn_blas_env() {
  [ -z "${OPENBLAS_CORETYPE:-}" ] && [ "${ATTN_BLAS_AUTOCORE:-1}" != 0 ] || return 0
  local info core="" from=""
  info="$("$1" info --json 2>/dev/null)" || return 0
  read -r core from < <(/usr/bin/python3 -c 'import json, sys; b = json.load(sys.stdin)["blas"]
print(b.get("coretype_env") or "-", b.get("autocore_from") or "-")' <<<"$info") || return 0
  [ "$from" != "-" ] && [ "$core" != "-" ] || return 0
  export OPENBLAS_CORETYPE="$core" ATTN_BLAS_AUTOCORE_FROM="$from"
  attn_log "OpenBLAS does not recognise this CPU and falls back to its $from kernels: OPENBLAS_CORETYPE=$core" \
    "for this run (ATTN_BLAS_AUTOCORE=0 keeps OpenBLAS's pick)"
}
# attn_build PRESET [TARGET...]: configure (once, and again when CMakePresets.json changed since: its cache
# variables apply only when configuring) and build with CMake presets into build/PRESET (every target, or the
# TARGETs named). ATTN_WERROR=ON in the
# environment (CI sets it: .ci/run) builds with warnings as errors (the ATTN_WERROR option; a user's build
# leaves it OFF): a change of it reconfigures the tree.
attn_build() {
  local preset="$1" werror="${ATTN_WERROR:-OFF}" targets=()
  shift
  [ $# -eq 0 ] || targets=(--target "$@")
  cd "$ATTN_ROOT"
  local cache="build/$preset/CMakeCache.txt"
  if [ ! -f "$cache" ] || [ CMakePresets.json -nt "$cache" ] || ! grep -qx "ATTN_WERROR:BOOL=$werror" "$cache"; then
    cmake --preset "$preset" -DATTN_WERROR="$werror" >/dev/null
  fi
  cmake --build --preset "$preset" -j "$(nproc)" "${targets[@]}"
}
