"""The checks made before a compiled library loads (sparsecomm.build_info), and the error a
user gets without Horovod (sparsecomm.prerequisites). The real mismatch, a torch 2.13 build
imported beside torch 2.14.1, is in test_install.py."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from paths import ROOT

from sparsecomm import build_info, cuda_toolkit

BUILT = {
    "sparsecomm": "0.1.0",
    "python": "3.11.7",
    "cpu_arch": "x86-64-v3",
    "cpu_features": ["avx2", "f16c"],
    "torch": {"version": "2.13.0+cpu", "cuda": None, "cuda_kernels": False},
}


@pytest.fixture
def record(tmp_path, monkeypatch):
    """Writes a build record where build_info reads it."""
    path = tmp_path / "_build_info.json"
    monkeypatch.setattr(build_info, "INFO_FILE", str(path))

    def write(info):
        path.write_text(json.dumps(info))

    return write


def test_a_matching_build_passes(record):
    record(BUILT)
    assert build_info.require("torch", "2.13.0+cpu", cpu_flags={"avx2", "f16c", "sse2"}) == BUILT


def test_another_torch_names_both_versions_and_the_rebuild_command(record):
    record(BUILT)
    with pytest.raises(
        ImportError,
        match=r"built for torch 2\.13\.0\+cpu, but torch 2\.14\.1\+cu130 is installed"
        r"(.|\n)*--no-build-isolation",
    ):
        build_info.require("torch", "2.14.1+cu130", cpu_flags={"avx2", "f16c"})


def test_an_installed_package_s_rebuild_skips_pip_s_cache(record, monkeypatch, tmp_path):
    """pip reinstalls the wheel it cached from the same sdist (the old build) unless told not to."""
    monkeypatch.setattr(build_info, "PACKAGE", str(tmp_path / "site-packages" / "sparsecomm"))
    record(BUILT)
    with pytest.raises(ImportError, match=r"pip install --no-cache-dir --no-build-isolation .*--force-reinstall"):
        build_info.require("torch", "2.14.1+cu130", cpu_flags={"avx2", "f16c"})


def test_a_framework_installed_after_the_build_asks_for_a_rebuild(record):
    record(BUILT)
    with pytest.raises(ImportError, match=r"built without TensorFlow support(.|\n)*TensorFlow 2\.21\.0 is installed"):
        build_info.require("tensorflow", "2.21.0", cpu_flags={"avx2", "f16c"})


def test_no_build_record_says_how_to_build(record, monkeypatch):
    monkeypatch.setattr(build_info, "INFO_FILE", "/nonexistent/_build_info.json")
    with pytest.raises(ImportError, match="not built"):
        build_info.require("torch", "2.13.0+cpu")


def test_a_cpu_without_the_build_s_extensions_is_refused_naming_them(record):
    record(dict(BUILT, cpu_arch="native", cpu_features=["avx2", "avx512f", "f16c"]))
    with pytest.raises(ImportError, match=r"CPUs with avx512f \(SPARSECOMM_CPU_ARCH=native\)"):
        build_info.require("torch", "2.13.0+cpu", cpu_flags={"avx2", "f16c"})


def test_this_checkout_s_build_fits_this_machine():
    """What `make build` wrote: this torch and TF, and this CPU's features."""
    import torch

    info = build_info.require("torch", torch.__version__)
    assert set(info["cpu_features"]) <= build_info.cpu_flags_here()
    assert {"avx2", "f16c", "fma"} <= set(info["cpu_features"])  # the default x86-64-v3 target


# libstdc++'s own code, which a library must neither define for others nor take from another copy:
# mixed with the libstdc++ torch loads, formatting an integer crashed (setup.py's link_flags).
LIBSTDCXX_INTERNALS = ("std::locale::classic()", "std::ios_base::Init::Init()", "std::ostream::_M_insert<long>(long)")


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
@pytest.mark.parametrize("library", ["sparsecomm/_C", "sparsecomm/tensorflow/_ops"])
def test_the_libraries_keep_a_static_libstdcxx_to_themselves(library):
    """A compiler that links libstdc++ in statically (a GPU image's /opt/gcc) must not make the
    libraries export that copy; with the shared libstdc++ (this machine's g++) nothing changes."""
    import glob

    built = glob.glob(os.path.join(ROOT, library + ".*.so"))  # by file: importing _ops needs TF
    if not built:
        pytest.skip(f"{library} is not built here")
    exported = subprocess.run(
        ["nm", "-D", "-C", "--defined-only", built[0]], capture_output=True, text=True, check=True
    ).stdout
    assert [name for name in LIBSTDCXX_INTERNALS if name in exported] == []


def _import_horovod_in_child(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_without_horovod_the_error_says_how_to_build_it():
    code = (
        "import sys; sys.path = [p for p in sys.path if 'site-packages' not in p]\n"
        "from sparsecomm import prerequisites\nprerequisites.horovod('torch')"
    )
    proc = _import_horovod_in_child(code)
    assert "Horovod, which is not installed" in proc.stderr and "sparsecomm.install_horovod" in proc.stderr, proc.stderr


def test_horovod_without_the_framework_says_so(tmp_path):
    """A Horovod whose torch part does not import (built without torch): the error names it."""
    (tmp_path / "horovod" / "torch").mkdir(parents=True)
    (tmp_path / "horovod" / "__init__.py").write_text("")
    (tmp_path / "horovod" / "torch" / "__init__.py").write_text(
        "raise ImportError('Extension horovod.torch has not been built')"
    )
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from sparsecomm import prerequisites\nprerequisites.horovod('torch')"
    )
    proc = _import_horovod_in_child(code)
    assert "built without PyTorch" in proc.stderr and "has not been built" in proc.stderr, proc.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on the PATH")
def test_the_cuda_toolkit_is_the_one_of_the_nvcc_found(monkeypatch):
    """/usr/local/bin/nvcc here is a wrapper script: torch guesses /usr/local, which has no headers."""
    monkeypatch.setenv("CUDA_HOME", os.path.dirname(os.path.dirname(shutil.which("nvcc"))))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    home = cuda_toolkit.find_cuda_home()
    assert os.path.exists(os.path.join(home, "include", "cuda_runtime.h")), home
