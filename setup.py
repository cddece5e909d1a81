"""Build sparsecomm: the Python package, one torch extension (sparsecomm._C) and, when
TensorFlow is installed, one TF op library (sparsecomm/tensorflow/_ops*.so), both from csrc/.

Environment switches:
  SPARSECOMM_WITH_CUDA=1|0   force the CUDA kernels on/off in both libraries (default: on in
                             each whose framework has CUDA, when a CUDA toolkit is found; TF
                             has CUDA when built with it and it sees a GPU)
  SPARSECOMM_WITH_TF=1|0     force the TF op library on/off (default: on when TF imports)
  SPARSECOMM_CPU_ARCH=...    -march for the CPU kernels (default: native; empty: none)
  SPARSECOMM_CUDA_ARCH=...   nvcc -arch for the TF library's CUDA kernels (default: native,
                             the build machine's GPU; the torch extension follows torch's
                             TORCH_CUDA_ARCH_LIST rule)
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


def _cuda_home():
    """The CUDA toolkit: torch's, else $CUDA_HOME, $CUDA_PATH or /usr/local/cuda (None: not found)."""
    homes = [cpp_extension.CUDA_HOME, os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return next((h for h in homes if h and os.path.exists(os.path.join(h, "bin", "nvcc"))), None)


def tensorflow_extension():
    with_tf = _switch("SPARSECOMM_WITH_TF")
    if with_tf is False:
        return None
    # TF is imported in a child process: its import is slow and must not leak into the build.
    # TF's Linux wheels are all built with CUDA (a CPU install just lacks the CUDA libraries), so
    # "TF has CUDA" means: built with it and a GPU visible to it.
    probe = ("import json, tensorflow as tf; print(json.dumps([tf.sysconfig.get_compile_flags(), "
             "tf.sysconfig.get_link_flags(), tf.test.is_built_with_cuda() and "
             "bool(tf.config.list_physical_devices('GPU'))]))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if result.returncode != 0:
        if with_tf:
            sys.exit("setup.py: SPARSECOMM_WITH_TF=1 but tensorflow does not import:\n" + result.stderr)
        print("setup.py: tensorflow not importable; building without the TF op library")
        return None
    compile_flags, link_flags, tf_has_cuda = json.loads(result.stdout.strip().splitlines()[-1])
    lib_dirs = [f[2:] for f in link_flags if f.startswith("-L")]
    sources = _sources("csrc/tensorflow/*.cc") + _sources("csrc/cpu/*.cpp")
    # TF's bundled Eigen does not compile with AVX512-FP16 (-march=native on Sapphire Rapids and
    # later: "predux_half_dowto4 is not a function template"); our kernels do not use it.
    cxx_flags = compile_flags + _cpu_flags() + _no_avx512fp16() + ["-Wno-deprecated-declarations"]  # TF headers
    link_args = link_flags + ["-fopenmp"] + [f"-Wl,-rpath,{d}" for d in lib_dirs]
    with_cuda, cuda_home = _switch("SPARSECOMM_WITH_CUDA"), _cuda_home()
    if with_cuda is None:
        with_cuda = tf_has_cuda and cuda_home is not None
    if not with_cuda:
        return Extension("sparsecomm.tensorflow._ops", sources, language="c++", extra_compile_args=cxx_flags,
                         extra_link_args=link_args)
    if cuda_home is None:
        sys.exit("setup.py: SPARSECOMM_WITH_CUDA=1 but no CUDA toolkit was found (set CUDA_HOME)")
    # GPU kernels: GOOGLE_CUDA turns on the families' GPU registrations (tensorflow/gpu.h), and
    # csrc/cuda/*.cu are compiled by BuildExt. The CUDA runtime of that nvcc is linked in
    # statically, ahead of TF's library (which exports a cuda* stub over TF's own runtime, of
    # another version maybe), and kept private.
    cudart = [f"-L{os.path.join(cuda_home, 'lib64')}", "-l:libcudart_static.a",
              "-Wl,--exclude-libs,libcudart_static.a", "-ldl", "-lrt", "-lpthread"]
    ext = Extension("sparsecomm.tensorflow._ops", sources, language="c++",
                    include_dirs=[os.path.join(cuda_home, "include")],
                    extra_compile_args=cxx_flags + ["-DGOOGLE_CUDA=1"], extra_link_args=cudart + link_args)
    ext.nvcc, ext.nvcc_sources = os.path.join(cuda_home, "bin", "nvcc"), _sources("csrc/cuda/*.cu")
    return ext


class BuildExt(cpp_extension.BuildExtension):
    """torch's BuildExtension, plus nvcc for an extension's `nvcc_sources` (the TF library's
    CUDA kernels): torch compiles .cu sources only when it has CUDA itself, and a CUDA TF build
    must not depend on that."""

    def build_extension(self, ext):
        for source in getattr(ext, "nvcc_sources", []):  # always recompiled: their headers are not tracked
            obj = os.path.join(self.build_temp, "nvcc", os.path.basename(source) + ".o")
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            self.spawn([ext.nvcc, "-c", f"-arch={os.environ.get('SPARSECOMM_CUDA_ARCH', 'native')}", "-std=c++17",
                        "-O3", "--fmad=false", "-Xcompiler", "-fPIC", os.path.join(ROOT, source), "-o", obj])
            ext.extra_objects.append(obj)
        super().build_extension(ext)


extensions = [e for e in (torch_extension(), tensorflow_extension()) if e is not None]

setup(
    name="sparsecomm",
    version="0.1.0",
    description="Sparse gradient compression (DGC, gradient dropping, rTop-k, random-block, SparDL) "
                "for Horovod with PyTorch and TensorFlow",
    packages=find_packages(include=["sparsecomm", "sparsecomm.*"]),
    python_requires=">=3.10",
    ext_modules=extensions,
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
