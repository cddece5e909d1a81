"""The build itself: Horovod's capabilities in the project environment, and a compile check
of every CUDA source (nvcc -c, no GPU needed) and of the torch and TF GPU bindings wherever nvcc
exists."""

import glob
import os
import re
import shutil
import subprocess
import sys

import pytest
from paths import ROOT

CUDA_SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
# The torch bindings compiled only into CUDA builds (setup.py's rule).
CUDA_BINDINGS = sorted(glob.glob(os.path.join(ROOT, "csrc", "torch", "cuda*.cpp")))
# The TF op families: their GPU kernels are compiled in with -DGOOGLE_CUDA=1 (setup.py's rule).
TF_FAMILIES = sorted(glob.glob(os.path.join(ROOT, "csrc", "tensorflow", "*.cc")))


def _cuda_include():
    from torch.utils import cpp_extension

    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), cpp_extension.CUDA_HOME, "/usr/local/cuda"]
    found = next(
        (
            os.path.join(h, "include")
            for h in homes
            if h and os.path.exists(os.path.join(h, "include", "cuda_runtime.h"))
        ),
        None,
    )
    if found is None:
        pytest.skip("no CUDA toolkit headers found ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda)")
    return found


def test_horovod_has_tensorflow_pytorch_mpi_and_gloo():
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    out = subprocess.run(
        [horovodrun, "--check-build"],
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    ).stdout
    for capability in ("TensorFlow", "PyTorch", "MPI", "Gloo"):
        assert f"[X] {capability}" in out, out


def test_there_are_cuda_sources():
    assert CUDA_SOURCES and CUDA_BINDINGS and TF_FAMILIES


@pytest.mark.parametrize("source", TF_FAMILIES, ids=os.path.basename)
def test_every_tf_op_has_a_gpu_kernel(source):
    """Read from the source (no GPU build here): every REGISTER_OP has a DEVICE_GPU kernel whose
    HostMemory args exist, and every int64 or double input (a scalar the kernel reads on the
    host) and int64 output (random_block_start's, computed on the host) is among them; a double
    output stays on the device (sum_of_squares). TF itself would only notice either on a GPU."""
    with open(source) as f:
        text = f.read()
    host_types = {"Input": ("int64", "double"), "Output": ("int64",)}
    ops = {
        name: {
            arg: dtype in host_types[kind]
            for kind, arg, dtype in re.findall(r'\.(Input|Output)\("(\w+): (\w+)"\)', chain)
        }
        for name, chain in re.findall(r'REGISTER_OP\("(\w+)"\)(.*?);', text, re.S)
    }
    gpu = {
        name: set(re.findall(r'"(\w+)"', host))
        for name, host in re.findall(r'Name\("(\w+)"\)\s*\.Device\(DEVICE_GPU\)((?:\s*\.HostMemory\("\w+"\))*)', text)
    }
    assert ops and set(gpu) == set(ops), f"ops without a GPU kernel: {sorted(set(ops) - set(gpu))}"
    for name, args in ops.items():
        assert gpu[name] <= set(args), f"{name}: HostMemory of no such arg: {sorted(gpu[name] - set(args))}"
        scalars = {arg for arg, on_host in args.items() if on_host}
        assert scalars <= gpu[name], f"{name}: read on the host but not HostMemory: {sorted(scalars - gpu[name])}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found: CUDA compile check skipped")
@pytest.mark.parametrize("source", CUDA_SOURCES, ids=os.path.basename)
def test_cuda_source_compiles(source, tmp_path):
    arch = os.environ.get("SPARSECOMM_CUDA_ARCH", "sm_90")
    cmd = [
        "nvcc",
        "-c",
        f"-arch={arch}",
        "-std=c++17",
        "-O3",
        "--fmad=false",
        "-Werror",
        "all-warnings",
        source,
        "-o",
        str(tmp_path / "out.o"),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stdout}\n{result.stderr}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found: CUDA binding check skipped")
@pytest.mark.parametrize("source", CUDA_BINDINGS, ids=os.path.basename)
def test_torch_cuda_binding_compiles(source, tmp_path):
    """Each csrc/torch/cuda*.cpp against torch's CUDA headers (syntax only: a CPU torch wheel
    lacks one generated header, stubbed here, and the CUDA libraries)."""
    import sysconfig

    from torch.utils import cpp_extension

    stub = tmp_path / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    cuda_include = _cuda_include()
    cmd = [
        "g++",
        "-std=c++20",
        "-fsyntax-only",
        "-Wall",
        "-Werror",
        f"-I{tmp_path}",
        f"-I{cuda_include}",
        f"-I{sysconfig.get_paths()['include']}",
    ] + [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd.append(source)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr[-5000:]}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found: TF GPU kernel check skipped")
@pytest.mark.parametrize("source", TF_FAMILIES, ids=os.path.basename)
def test_tf_gpu_kernels_compile(source):
    """Each csrc/tensorflow/*.cc with its GPU kernels (-DGOOGLE_CUDA=1, as CUDA builds compile
    it) against TF's headers and the CUDA toolkit's, syntax only: the kernel templates are
    instantiated for every registered dtype, but nothing is linked or run. The TF headers are
    system headers here (their own warnings are not ours); -std=c++20 as torch's BuildExtension
    builds the TF library."""
    tf = pytest.importorskip("tensorflow")
    flags = []
    for flag in tf.sysconfig.get_compile_flags():
        flags += ["-isystem", flag[2:]] if flag.startswith("-I") else [flag]
    cmd = (
        ["g++"]
        + flags
        + ["-std=c++20", "-fsyntax-only", "-Wall", "-Werror", "-DGOOGLE_CUDA=1", "-isystem", _cuda_include(), source]
    )
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr[-5000:]}"
