"""Build sparsecomm: the Python package, one torch extension (sparsecomm._C) and, when
TensorFlow is installed, one TF op library (sparsecomm/tensorflow/_ops*.so), both from csrc/.

Environment switches:
  SPARSECOMM_WITH_CUDA=1|0   force the CUDA kernels on/off (default: on when torch has CUDA
                             and a CUDA toolkit is found)
  SPARSECOMM_WITH_TF=1|0     force the TF op library on/off (default: on when TF imports)
  SPARSECOMM_CPU_ARCH=...    -march for the CPU kernels (default: native; empty: none)
"""
import glob
import json
import os
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _switch(name):
    value = os.environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        sys.exit(f"setup.py: {name} should be 0 or 1, got {value!r}")
    return None if value == "" else value == "1"


def _sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def _cpu_flags():
    arch = os.environ.get("SPARSECOMM_CPU_ARCH", "native")
    # No floating-point contraction (FMA): kernels compute in the written order with one rounding
    # per operation, so CPU, CUDA, torch, TF and a plain numpy reference agree bit for bit.
    # The C++ standard comes from torch / TF.
    # OpenMP splits the memory-bound passes over the cores (the runtime torch already uses).
    return ["-O3", "-ffp-contract=off", "-fopenmp"] + ([f"-march={arch}"] if arch else [])


def _no_avx512fp16():
    return ["-mno-avx512fp16"] if os.environ.get("SPARSECOMM_CPU_ARCH", "native") else []


def torch_extension():
    with_cuda = _switch("SPARSECOMM_WITH_CUDA")
    if with_cuda is None:
        import torch
        with_cuda = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    # The CUDA side (csrc/torch/cuda*.cpp, csrc/cuda/*.cu) is compiled only into CUDA builds.
    cuda_bindings = _sources("csrc/torch/cuda*.cpp")
    sources = [s for s in _sources("csrc/torch/*.cpp") if s not in cuda_bindings] + _sources("csrc/cpu/*.cpp")
    if not with_cuda:
        return cpp_extension.CppExtension("sparsecomm._C", sources, extra_compile_args={"cxx": _cpu_flags()},
                                          extra_link_args=["-fopenmp"])
    sources += cuda_bindings + _sources("csrc/cuda/*.cu")
    return cpp_extension.CUDAExtension(
        "sparsecomm._C", sources,
        extra_compile_args={"cxx": _cpu_flags(), "nvcc": ["-O3", "--fmad=false"]}, extra_link_args=["-fopenmp"])


def tensorflow_extension():
    with_tf = _switch("SPARSECOMM_WITH_TF")
    if with_tf is False:
        return None
    # TF is imported in a child process: its import is slow and must not leak into the build.
    probe = ("import json, tensorflow as tf; "
             "print(json.dumps([tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()]))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if result.returncode != 0:
        if with_tf:
            sys.exit("setup.py: SPARSECOMM_WITH_TF=1 but tensorflow does not import:\n" + result.stderr)
        print("setup.py: tensorflow not importable; building without the TF op library")
        return None
    compile_flags, link_flags = json.loads(result.stdout.strip().splitlines()[-1])
    lib_dirs = [f[2:] for f in link_flags if f.startswith("-L")]
    return Extension(
        "sparsecomm.tensorflow._ops",
        _sources("csrc/tensorflow/*.cc") + _sources("csrc/cpu/*.cpp"),
        language="c++",
        # TF's bundled Eigen does not compile with AVX512-FP16 (-march=native on Sapphire Rapids and
        # later: "predux_half_dowto4 is not a function template"); our kernels do not use it.
        extra_compile_args=compile_flags + _cpu_flags() + _no_avx512fp16() + ["-Wno-deprecated-declarations"],
        extra_link_args=link_flags + ["-fopenmp"] + [f"-Wl,-rpath,{d}" for d in lib_dirs],
    )


extensions = [e for e in (torch_extension(), tensorflow_extension()) if e is not None]

setup(
    name="sparsecomm",
    version="0.1.0",
    description="Sparse gradient compression (DGC, gradient dropping, rTop-k, random-block, SparDL) "
                "for Horovod with PyTorch and TensorFlow",
    packages=find_packages(include=["sparsecomm", "sparsecomm.*"]),
    python_requires=">=3.10",
    ext_modules=extensions,
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    zip_safe=False,
)
