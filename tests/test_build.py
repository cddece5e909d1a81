"""The build itself: Horovod's capabilities in the project environment, and a compile check
of every CUDA source (nvcc -c, no GPU needed) wherever nvcc exists."""
import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
# The torch bindings compiled only into CUDA builds (setup.py's rule).
CUDA_BINDINGS = sorted(glob.glob(os.path.join(ROOT, "csrc", "torch", "cuda*.cpp")))


def test_horovod_has_tensorflow_pytorch_mpi_and_gloo():
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    out = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True, timeout=180,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")).stdout
    for capability in ("TensorFlow", "PyTorch", "MPI", "Gloo"):
        assert f"[X] {capability}" in out, out


def test_there_are_cuda_sources():
    assert CUDA_SOURCES and CUDA_BINDINGS


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found: CUDA compile check skipped")
@pytest.mark.parametrize("source", CUDA_SOURCES, ids=os.path.basename)
def test_cuda_source_compiles(source, tmp_path):
    arch = os.environ.get("SPARSECOMM_CUDA_ARCH", "sm_90")
    cmd = ["nvcc", "-c", f"-arch={arch}", "-std=c++17", "-O3", "--fmad=false", "-Werror", "all-warnings", source,
           "-o", str(tmp_path / "out.o")]
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
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), cpp_extension.CUDA_HOME, "/usr/local/cuda"]
    cuda_include = next((os.path.join(h, "include") for h in homes
                         if h and os.path.exists(os.path.join(h, "include", "cuda_runtime.h"))), None)
    if cuda_include is None:
        pytest.skip("no CUDA toolkit headers found ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda)")
    cmd = ["g++", "-std=c++20", "-fsyntax-only", "-Wall", "-Werror", f"-I{tmp_path}", f"-I{cuda_include}",
           f"-I{sysconfig.get_paths()['include']}"] + [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd.append(source)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr[-5000:]}"
