#!/usr/bin/env bash
# Fills .device/ with what a lent GPU machine lacks to build and run Horovod with sparsecomm
# (it has no network): Horovod 0.28.1's sdist and wheels of the pure-Python packages around it.
# scripts/device/run.sh installs them there; the device call carries .device (docs/install.md,
# "On a lent GPU").
#
#   bash scripts/device/bundle.sh [--python-version 3.12] [--dest .device]
#
# The device's Python is CPython 3.12 on manylinux x86-64; --python-version 3.11 makes the bundle
# for this machine's Python instead (run.sh --rehearse uses it). Not bundled: NCCL's headers and
# library. The device's torch (2.11.0+cu130) depends on the nvidia-nccl-cu13 wheel, which ships
# both (site-packages/nvidia/nccl/{include/nccl.h,lib/libnccl.so.2}, where install_horovod looks);
# that wheel is 196 MB, over what travels.
set -euo pipefail
cd "$(dirname "$0")/../.."

python_version=3.12
dest=.device
while [ $# -gt 0 ]; do
  case "$1" in
  --python-version) python_version=$2; shift 2 ;;
  --dest) dest=$2; shift 2 ;;
  *) echo "usage: bash scripts/device/bundle.sh [--python-version X.Y] [--dest DIR]" >&2; exit 2 ;;
  esac
done
LIMIT_MIB=40
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

# Horovod's run-time dependencies (install_horovod.RUNTIME_DEPS; cffi needs pycparser), pytest
# for the op tests under compute-sanitizer (with its own dependencies), and wheel and setuptools
# for the builds without isolation. The versions are those of the project's .venv. The device's
# image lists all of them but cffi and pycparser; pip installs a bundled one only where the
# device has none (run.sh never upgrades).
WHEELS=(
  cffi==2.1.1 pycparser==3.12 cloudpickle==3.1.3 psutil==7.2.2 pyyaml==6.0.4 packaging==26.4
  pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0
  wheel==0.48.0 setuptools==80.10.2
)

# pip, minus the warnings this machine kind's global pip config prints for its local indexes.
pip_() { "$PY" -m pip "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }

mkdir -p "$dest"
echo "[bundle] Horovod 0.28.1's sdist -> $dest"
pip_ download -q --no-deps --no-binary=:all: horovod==0.28.1 -d "$dest"
echo "[bundle] wheels for CPython $python_version, manylinux x86_64 -> $dest"
pip_ download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dest" "${WHEELS[@]}"

# One version of each package: a left-over older one would make pip's choice depend on the folder.
names=$(cd "$dest" && printf '%s\n' *.whl *.tar.gz | sed -E 's/-[0-9][^-]*(-.*)?\.(whl|tar\.gz)$//' | tr 'A-Z_.' 'a-z--' | sort)
dupes=$(uniq -d <<<"$names")
[ -z "$dupes" ] || { echo "[bundle] FAILED: more than one version of: $dupes (empty $dest and run again)" >&2; exit 1; }

(cd "$dest" && stat -c '  %9s  %n' -- *.whl *.tar.gz)
bytes=$(du -sb "$dest" | cut -f1)
echo "[bundle] $dest holds $(find "$dest" -type f | wc -l) files, $((bytes / 1024)) KiB (limit ${LIMIT_MIB} MiB)"
if [ "$bytes" -gt $((LIMIT_MIB * 1024 * 1024)) ]; then
  echo "[bundle] FAILED: over ${LIMIT_MIB} MiB; the device call carries at most 64 MiB with the working tree" >&2
  exit 1
fi
