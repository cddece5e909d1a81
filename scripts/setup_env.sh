#!/usr/bin/env bash
# One step of the project environment install, driven by the Makefile (`make env`).
#   scripts/setup_env.sh system|venv|deps|horovod
# Each step is idempotent; the Makefile's stamp files skip steps already done.
# On failure it names the step and what to try next.
set -euo pipefail

VENV=$(realpath -m "${VENV:-.venv}")
PY="$VENV/bin/python"
CACHE=${SPARSECOMM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sparsecomm}
HOROVOD_VERSION=0.28.1
step=${1:?usage: setup_env.sh system|venv|deps|horovod}

say()  { printf '[setup:%s] %s\n' "$step" "$*"; }
fail() { printf '\n[setup:%s] FAILED: %s\n[setup:%s] what to do: %s\n' "$step" "$1" "$step" "$2" >&2; exit 1; }

# pip, minus the warnings this machine kind's global pip config prints for its local indexes.
pip_() { "$PY" -m pip "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

case "$step" in
system)
  # OpenMPI (mpirun/mpicc for Horovod's MPI controller and mpi4py), iproute2 (network namespaces
  # for the slow-network benchmarks) and ccache (make build's and the suite's compiles read their
  # objects back when the inputs repeat: docs/testing.md) from the distribution.
  if command -v mpicc >/dev/null && command -v mpirun >/dev/null && command -v ip >/dev/null \
    && command -v ccache >/dev/null; then
    say "OpenMPI, iproute2 and ccache already present"; exit 0
  fi
  say "installing libopenmpi-dev openmpi-bin iproute2 ccache with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq || fail "apt-get update" "check that Debian's package mirrors are reachable, then re-run make env"
  as_root apt-get install -y -qq libopenmpi-dev openmpi-bin iproute2 ccache >/dev/null \
    || fail "apt-get install libopenmpi-dev openmpi-bin iproute2 ccache" "install them by hand (needs root) and re-run make env"
  ;;

venv)
  if [ -x "$PY" ]; then say "$VENV exists"; exit 0; fi
  say "creating $VENV with $(python3 --version)"
  python3 -m venv "$VENV" || fail "python3 -m venv $VENV" "install python3-venv (Python 3.11 is the supported version)"
  ;;

deps)
  say "installing requirements.txt into $VENV (torch from the local wheel, TensorFlow from the registry)"
  pip_ install -q -r requirements.txt \
    || fail "pip install -r requirements.txt" "read pip's message above; torch must stay pinned to 2.13.0 (a local CPU wheel)"
  # The benchmarks' packages, apart: a process sees them once it imports benchmarks (benchmarks/__init__.py).
  say "installing benchmarks/requirements.txt into $VENV/bench-packages"
  rm -rf "$VENV/bench-packages"
  pip_ install -q --target "$VENV/bench-packages" -r benchmarks/requirements.txt \
    || fail "pip install --target $VENV/bench-packages -r benchmarks/requirements.txt" "read pip's message above"
  ;;

horovod)
  # The same script a user runs in their own environment (docs/install.md): it builds Horovod
  # 0.28.1 for the installed torch and TF with the edits it needs, caching the wheel OUTSIDE the
  # clone keyed by every version it was compiled against, so fresh clones (and CI) just install it.
  # It ends with horovodrun --check-build, which must list TensorFlow, PyTorch, Gloo and MPI.
  "$PY" -m sparsecomm.install_horovod --cache "$CACHE" \
    || fail "building or installing Horovod $HOROVOD_VERSION" "read the message above; MPI headers (step system) and torch/TF (step deps) must be installed"
  ;;

*) echo "unknown step: $step" >&2; exit 2 ;;
esac
