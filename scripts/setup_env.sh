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
  # OpenMPI (mpirun/mpicc for Horovod's MPI controller and mpi4py) and iproute2 (network
  # namespaces for the slow-network benchmarks) from the distribution.
  if command -v mpicc >/dev/null && command -v mpirun >/dev/null && command -v ip >/dev/null; then
    say "OpenMPI and iproute2 already present"; exit 0
  fi
  say "installing libopenmpi-dev openmpi-bin iproute2 with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq || fail "apt-get update" "check that Debian's package mirrors are reachable, then re-run make env"
  as_root apt-get install -y -qq libopenmpi-dev openmpi-bin iproute2 >/dev/null \
    || fail "apt-get install libopenmpi-dev openmpi-bin iproute2" "install them by hand (needs root) and re-run make env"
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
  ;;

horovod)
  # Horovod 0.28.1 is source-only and does not build as published against torch 2.13 / TF 2.21.
  # We build a wheel once, with two CMake fixes, and cache it OUTSIDE the clone keyed by every
  # version it was compiled against, so fresh clones (and CI) just install the cached wheel.
  export TF_CPP_MIN_LOG_LEVEL=3  # TF's start-up logs say nothing useful here
  versions=$("$PY" - <<'PYEOF'
import sys, torch, tensorflow as tf
print(f"cp{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__.split('+')[0]}-tf{tf.__version__}")
PYEOF
) || fail "importing torch and tensorflow" "run 'make env' again; the deps step may not have finished"
  wheel_dir="$CACHE/wheels/horovod-$HOROVOD_VERSION-$versions"
  wheel=$(ls "$wheel_dir"/horovod-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    say "no cached wheel in $wheel_dir: building Horovod $HOROVOD_VERSION from source (about 8-10 minutes on 2 cores)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    pip_ download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work" \
      || fail "downloading the horovod==$HOROVOD_VERSION sdist" "check access to the package registry"
    tar -xzf "$work"/horovod-$HOROVOD_VERSION.tar.gz -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    # Fix 1: torch >= 2.1 headers need C++17 ("C++17 or later compatible compiler is required").
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    # Fix 2: the TF 2.21 wheel lacks highwayhash headers needed by the XLA ops (GPU XLA only).
    sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 14' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt" \
      && fail "patching Horovod's CMake files to C++17" "the sdist layout changed; see ENVIRONMENT notes in docs/install.md"
    say "compiling (log: $CACHE/horovod-build.log)"
    mkdir -p "$CACHE"
    if ! (cd "$src" && HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
          HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_GPU_OPERATIONS= \
          MAKEFLAGS="-j$(nproc)" \
          "$PY" -m pip wheel -v --no-deps --no-build-isolation . -w "$work/dist") > "$CACHE/horovod-build.log" 2>&1; then
      tail -30 "$CACHE/horovod-build.log" >&2
      fail "building Horovod $HOROVOD_VERSION" "read $CACHE/horovod-build.log; MPI headers (step system) and torch/TF (step deps) must be installed"
    fi
    mkdir -p "$wheel_dir"
    cp "$work"/dist/horovod-*.whl "$wheel_dir/"
    wheel=$(ls "$wheel_dir"/horovod-*.whl | head -1)
  else
    say "using cached wheel $wheel"
  fi
  pip_ install -q --no-deps --force-reinstall "$wheel" || fail "pip install $wheel" "delete $wheel_dir and re-run make env to rebuild it"
  out=$(PATH="$VENV/bin:$PATH" "$VENV/bin/horovodrun" --check-build 2>&1) || true
  echo "$out" | sed 's/^/    /'
  for fw in TensorFlow PyTorch MPI Gloo; do
    echo "$out" | grep -q "\[X\] $fw" || fail "horovodrun --check-build does not list $fw" "delete $wheel_dir and re-run make env; read $CACHE/horovod-build.log"
  done
  ;;

*) echo "unknown step: $step" >&2; exit 2 ;;
esac
