"""Build Horovod 0.28.1 into this Python environment, for the torch and/or TensorFlow installed
in it, and install it.

    python -m sparsecomm.install_horovod [--cache DIR] [--dry-run]
        [--sdist PATH] [--find-links DIR] [--without-mpi] [--gpu-operations auto|NCCL|none]

Horovod 0.28.1 (2023) is source-only and does not build as published against current
frameworks. This script makes the edits it needs, then builds a wheel with pip (no build
isolation: Horovod must compile against the frameworks you run):

  - the C++ standard: 17, or 20 where torch's headers require it (torch 2.14);
  - TensorFlow's XLA ops dropped (the TF wheels lack the headers they include);
  - a CUDA torch: the CUDA toolkit of the nvcc found, and NCCL from the nvidia-nccl wheel
    that torch depends on (or $HOROVOD_NCCL_HOME), so cuda tensors go through NCCL.

The wheel is cached under DIR (default ~/.cache/sparsecomm), keyed by every version it was
compiled against, so a second environment with the same versions installs it in seconds.
Offline (a machine with no network: scripts/device/run.sh), --sdist takes Horovod's sdist
from a file and --find-links installs its run-time dependencies from a folder of wheels only.
It imports nothing of sparsecomm but cuda_toolkit, so a checkout runs it before any build.
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

from .cuda_toolkit import find_cuda_home

HOROVOD_VERSION = "0.28.1"
RUNTIME_DEPS = ["cffi>=1.4", "cloudpickle>=2", "psutil>=5", "pyyaml>=6", "packaging>=23"]
PROBE = """
import json, os, sys
found = {"python": f"cp{sys.version_info.major}{sys.version_info.minor}"}
try:
    import torch
    found["torch"] = torch.__version__
    found["torch_cuda"] = torch.version.cuda
    found["torch_include"] = os.path.join(os.path.dirname(torch.__file__), "include")
except ImportError:
    pass
try:
    import tensorflow as tf
    found["tensorflow"] = tf.__version__
except ImportError:
    pass
print(json.dumps(found))
"""


class InstallError(Exception):
    """A step that cannot go on, with what to do about it."""


def say(message):
    print(f"[install_horovod] {message}", flush=True)


def probe_frameworks():
    """The frameworks this interpreter imports: {"python", "torch", "torch_cuda", "torch_include", "tensorflow"}."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise InstallError(f"probing torch and TensorFlow failed:\n{proc.stderr}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    if "torch" not in found and "tensorflow" not in found:
        raise InstallError(
            "neither torch nor TensorFlow imports in this environment: install the framework "
            f"first (Horovod compiles against it), with {sys.executable} -m pip install ..."
        )
    return found


def cxx_standard(torch_include):
    """The C++ standard torch's headers ask for (ATen.h: "#error C++N or later ..."), at least 17."""
    header = os.path.join(torch_include or "", "ATen", "ATen.h") if torch_include else None
    if header and os.path.exists(header):
        with open(header) as f:
            asked = re.findall(r"C\+\+(\d+) or later compatible compiler is required", f.read())
        if asked:
            return max(17, int(asked[0]))
    return 17


def find_nccl(work):
    """A NCCL home (include/nccl.h, lib/libnccl.so) for Horovod's CMake: $HOROVOD_NCCL_HOME, or the
    nvidia-nccl wheel torch depends on (it ships only libnccl.so.2: a link dir in `work` adds the
    unversioned name the linker looks for). None when there is no NCCL."""
    if os.environ.get("HOROVOD_NCCL_HOME"):
        return os.environ["HOROVOD_NCCL_HOME"]
    for wheel in glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "nccl*")):
        header, libs = os.path.join(wheel, "include", "nccl.h"), glob.glob(os.path.join(wheel, "lib", "libnccl.so*"))
        if os.path.exists(header) and libs:
            home = os.path.join(work, "nccl")
            os.makedirs(os.path.join(home, "lib"), exist_ok=True)
            os.symlink(os.path.join(wheel, "include"), os.path.join(home, "include"))
            os.symlink(sorted(libs)[0], os.path.join(home, "lib", "libnccl.so"))
            return home
    return None


def builds_with_mpi(without_mpi=False):
    """Whether Horovod is built with MPI: where mpicc is found, unless --without-mpi."""
    return shutil.which("mpicc") is not None and not without_mpi


def build_env(found, work, without_mpi=False, gpu_operations="auto"):
    """Horovod's build switches for what is installed, and the lines that say what was chosen.
    without_mpi: Gloo only, even where mpicc is found. gpu_operations: "auto" (NCCL for a CUDA
    torch when NCCL is found), "NCCL" (the same, but stop without NCCL), "none" (no GPU
    operations: Horovod copies cuda tensors to host memory and back around Gloo or MPI)."""
    env = dict(os.environ, HOROVOD_WITHOUT_MXNET="1", HOROVOD_WITH_GLOO="1", MAKEFLAGS=f"-j{os.cpu_count() or 1}")
    # CMake 4 refuses projects that ask for a version below 3.5, as Horovod's bundled Gloo does
    # (2.8.12); this lets it configure them (older CMake ignores the variable).
    env.setdefault("CMAKE_POLICY_VERSION_MINIMUM", "3.5")
    for name in ("PYTORCH", "TENSORFLOW", "MPI"):  # a switch left in the environment would contradict ours
        env.pop(f"HOROVOD_WITH_{name}", None)
        env.pop(f"HOROVOD_WITHOUT_{name}", None)
    env["HOROVOD_WITH_PYTORCH" if "torch" in found else "HOROVOD_WITHOUT_PYTORCH"] = "1"
    env["HOROVOD_WITH_TENSORFLOW" if "tensorflow" in found else "HOROVOD_WITHOUT_TENSORFLOW"] = "1"
    mpi = builds_with_mpi(without_mpi)
    env["HOROVOD_WITH_MPI" if mpi else "HOROVOD_WITHOUT_MPI"] = "1"
    why_not = "--without-mpi" if without_mpi else "no mpicc on the PATH"
    notes = ["MPI: " + ("yes (mpicc found)" if mpi else f"no ({why_not}; Gloo only)")]
    env["HOROVOD_GPU_OPERATIONS"] = ""
    if gpu_operations == "NCCL" and not found.get("torch_cuda"):
        raise InstallError(f"--gpu-operations NCCL: torch {found.get('torch', '(absent)')} is not a CUDA build")
    if found.get("torch_cuda"):
        # Horovod's torch library is built with CUDA for a CUDA torch whatever the GPU operations
        # (its own few kernels too), so the toolkit and the architectures are wanted either way.
        cuda_home = find_cuda_home()
        if cuda_home is None:
            raise InstallError(
                f"torch {found['torch']} is a CUDA {found['torch_cuda']} build, and Horovod's "
                "build then needs the CUDA toolkit: put its nvcc on the PATH or set CUDA_HOME"
            )
        env.update(CUDA_HOME=cuda_home, HOROVOD_CUDA_HOME=cuda_home)
        if os.environ.get("TORCH_CUDA_ARCH_LIST"):  # "8.0;9.0+PTX" -> "80,90"; unset: every arch nvcc has
            archs = re.findall(r"(\d+)\.(\d+)", os.environ["TORCH_CUDA_ARCH_LIST"])
            env["HOROVOD_BUILD_CUDA_CC_LIST"] = ",".join(major + minor for major, minor in archs)
        nccl = None if gpu_operations == "none" else find_nccl(work)
        if nccl is None and gpu_operations == "NCCL":
            raise InstallError(
                "--gpu-operations NCCL: no NCCL found (torch's nvidia-nccl wheel, or set HOROVOD_NCCL_HOME)"
            )
        if nccl:
            env.update(HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_NCCL_HOME=nccl, HOROVOD_NCCL_LINK="SHARED")
        host = "cuda tensors go through host memory"
        why = f"none asked ({host})" if gpu_operations == "none" else f"not found ({host}; set HOROVOD_NCCL_HOME)"
        notes.append(f"CUDA toolkit: {cuda_home}; NCCL: {nccl or why}")
    return env, notes


def cache_key(found, without_mpi=False, gpu_operations="auto"):
    parts = [f"horovod-{HOROVOD_VERSION}", found["python"]]
    parts += [f"torch{found['torch']}"] if "torch" in found else []
    parts += [f"tf{found['tensorflow']}"] if "tensorflow" in found else []
    parts += ["nompi"] if without_mpi else []
    parts += ["nogpuops"] if gpu_operations == "none" and found.get("torch_cuda") else []
    return "-".join(parts)


def patch_sources(src, standard, with_tf):
    """The edits Horovod 0.28.1 needs: the C++ standard, and no XLA ops for TensorFlow."""
    for cmake in (os.path.join(src, "CMakeLists.txt"), os.path.join(src, "horovod", "torch", "CMakeLists.txt")):
        with open(cmake) as f:
            text = f.read()
        if "set(CMAKE_CXX_STANDARD 14)" not in text:
            raise InstallError(
                f"{cmake} has no 'set(CMAKE_CXX_STANDARD 14)' to raise: not Horovod {HOROVOD_VERSION}'s layout"
            )
        with open(cmake, "w") as f:
            f.write(text.replace("set(CMAKE_CXX_STANDARD 14)", f"set(CMAKE_CXX_STANDARD {standard})"))
    if with_tf:
        cmake = os.path.join(src, "horovod", "tensorflow", "CMakeLists.txt")
        with open(cmake) as f:
            lines = f.readlines()
        with open(cmake, "w") as f:
            f.writelines(line for line in lines if "xla_mpi_ops.cc" not in line)


def pip(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "pip", *args], check=True, **kwargs)


def build_wheel(found, wheel_dir, sdist=None, without_mpi=False, gpu_operations="auto"):
    """Patches Horovod's sdist (downloaded, or the file `sdist`) and builds a wheel into
    wheel_dir (log beside it); without_mpi and gpu_operations as build_env takes them."""
    with tempfile.TemporaryDirectory() as work:
        if sdist is None:
            say(f"downloading the horovod=={HOROVOD_VERSION} sdist")
            pip("download", "-q", "--no-deps", "--no-binary", ":all:", f"horovod=={HOROVOD_VERSION}", "-d", work)
            sdist = os.path.join(work, f"horovod-{HOROVOD_VERSION}.tar.gz")
        elif not os.path.basename(sdist).startswith(f"horovod-{HOROVOD_VERSION}."):
            raise InstallError(f"{sdist} is not Horovod {HOROVOD_VERSION}'s sdist (horovod-{HOROVOD_VERSION}.tar.gz)")
        say(f"unpacking {sdist}")
        shutil.unpack_archive(sdist, work)
        src = os.path.join(work, f"horovod-{HOROVOD_VERSION}")
        standard = cxx_standard(found.get("torch_include"))
        patch_sources(src, standard, "tensorflow" in found)
        env, notes = build_env(found, work, without_mpi, gpu_operations)
        switches = " ".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith("HOROVOD_") and v)
        for line in [f"C++{standard}; XLA ops dropped: {'tensorflow' in found}"] + notes + [switches]:
            say(line)
        os.makedirs(wheel_dir, exist_ok=True)
        log = os.path.join(wheel_dir, "build.log")
        say(f"compiling (about 8-10 minutes on 2 cores; log: {log})")
        with open(log, "w") as out:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "wheel",
                    "-v",
                    "--no-deps",
                    "--no-build-isolation",
                    src,
                    "-w",
                    os.path.join(work, "dist"),
                ],
                cwd=work,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        if proc.returncode != 0:
            with open(log) as f:
                tail = "".join(f.readlines()[-30:])
            raise InstallError(
                f"building Horovod failed; the end of {log}:\n{tail}\nIs `wheel` installed "
                "(pip install wheel)? Are the MPI headers and a C++ compiler there?"
            )
        for built in glob.glob(os.path.join(work, "dist", "horovod-*.whl")):
            shutil.copy(built, wheel_dir)


def check_build(found, nccl=False, mpi=False):
    """horovodrun --check-build must list every installed framework, Gloo, and MPI and NCCL if asked."""
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PATH=path)
    out = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True, env=env).stdout
    print("\n".join("    " + line for line in out.splitlines() if line.strip()))
    missing = missing_from_build(out, found, nccl, mpi)
    if missing:
        raise InstallError(
            f"horovodrun --check-build does not list {', '.join(missing)}: delete the cached wheel "
            "and run again, then read its build.log"
        )


def missing_from_build(out, found, nccl=False, mpi=False):
    """What horovodrun --check-build's output `out` does not list of what check_build asks for."""
    wanted = [name for key, name in (("torch", "PyTorch"), ("tensorflow", "TensorFlow")) if key in found] + ["Gloo"]
    wanted += ["MPI"] if mpi else []
    wanted += ["NCCL"] if nccl else []
    return [name for name in wanted if f"[X] {name}" not in out]


def default_cache():
    return os.environ.get("SPARSECOMM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sparsecomm"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m sparsecomm.install_horovod",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cache", default=default_cache(), help="where built wheels are kept (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be built, build nothing")
    parser.add_argument(
        "--sdist", metavar="PATH", help=f"build from this horovod-{HOROVOD_VERSION}.tar.gz, not a download"
    )
    parser.add_argument(
        "--find-links",
        metavar="DIR",
        help="install Horovod's run-time dependencies from the wheels in DIR alone (offline)",
    )
    parser.add_argument("--without-mpi", action="store_true", help="Gloo only, even where mpicc is found")
    parser.add_argument(
        "--gpu-operations",
        choices=("auto", "NCCL", "none"),
        default="auto",
        help="auto: NCCL for a CUDA torch where NCCL is found (default); NCCL: the same, or fail; "
        "none: cuda tensors go through host memory",
    )
    args = parser.parse_args(argv)
    try:
        found = probe_frameworks()
        wheel_dir = os.path.join(args.cache, "wheels", cache_key(found, args.without_mpi, args.gpu_operations))
        say(
            f"frameworks: torch {found.get('torch', 'absent')}, TensorFlow {found.get('tensorflow', 'absent')}; "
            f"C++{cxx_standard(found.get('torch_include'))}; wheel cache {wheel_dir}"
        )
        if args.dry_run:
            return 0
        if not glob.glob(os.path.join(wheel_dir, "horovod-*.whl")):
            sdist = args.sdist and os.path.abspath(args.sdist)
            build_wheel(found, wheel_dir, sdist, args.without_mpi, args.gpu_operations)
        wheel = sorted(glob.glob(os.path.join(wheel_dir, "horovod-*.whl")))[0]
        say(f"installing {wheel}")
        pip("install", "-q", "--no-deps", "--force-reinstall", wheel)
        offline = ["--no-index", "--find-links", args.find_links] if args.find_links else []
        pip("install", "-q", *offline, *RUNTIME_DEPS)
        check_build(found, nccl=args.gpu_operations == "NCCL", mpi=builds_with_mpi(args.without_mpi))
    except (InstallError, subprocess.CalledProcessError) as error:
        print(f"[install_horovod] FAILED: {error}", file=sys.stderr)
        return 1
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
