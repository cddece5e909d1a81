"""Build sparsecomm against the torch and/or TensorFlow installed in this environment:

    pip install --no-cache-dir --no-build-isolation .   (a checkout, or sparsecomm-X.tar.gz)

Builds the torch extension sparsecomm._C when torch imports and the TF op library
sparsecomm/tensorflow/_ops*.so when TensorFlow imports, both from csrc/, and writes
sparsecomm/_build_info.json (the versions built against, checked at import). A build that sees
neither framework (pip's default isolated build) stops and names the command above.

Environment switches (docs/install.md):
  SPARSECOMM_WITH_TORCH=1|0  force the torch extension on/off (default: on when torch imports)
  SPARSECOMM_WITH_TF=1|0     force the TF op library on/off (default: on when TF imports)
  SPARSECOMM_WITH_CUDA=1|0   force the CUDA kernels on/off (default: on for a CUDA torch when a
                             CUDA toolkit is found; for TF, when it also sees a GPU)
  SPARSECOMM_CPU_ARCH=...    -march of the CPU kernels (default x86-64-v3 on x86-64: AVX2,
                             FMA, F16C; "native" for this machine's CPU; empty: none)
  TORCH_CUDA_ARCH_LIST=...   GPU architectures of the torch extension (default: the visible
                             GPUs', or with none visible, those torch itself was built for)
  SPARSECOMM_CUDA_ARCH=...   nvcc -arch of the TF library (default native, or all-major
                             without a visible GPU)
  CUDA_HOME=...              the CUDA toolkit (default: that of the nvcc on the PATH)
"""

import functools
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from glob import glob

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
VERSION = "0.1.0"
HOW_TO_BUILD = (
    "sparsecomm compiles against the torch and/or TensorFlow of your environment, and this "
    "build sees neither (pip builds in an isolated environment unless told otherwise). "
    "Install the framework first, then:\n    pip install --no-cache-dir --no-build-isolation sparsecomm-*.tar.gz"
    "   (or `pip install --no-build-isolation .` in a checkout)"
)
# -march macros -> /proc/cpuinfo flags: what a build may execute, checked at import (build_info.py).
CPU_FEATURES = {
    "__SSE4_2__": "sse4_2",
    "__AVX__": "avx",
    "__AVX2__": "avx2",
    "__FMA__": "fma",
    "__F16C__": "f16c",
    "__BMI2__": "bmi2",
    "__AVX512F__": "avx512f",
    "__AVX512BW__": "avx512bw",
    "__AVX512VL__": "avx512vl",
    "__AVX512DQ__": "avx512dq",
    "__AVX512CD__": "avx512cd",
    "__AVX512FP16__": "avx512_fp16",
    "__AVX512BF16__": "avx512_bf16",
    "__AVX512VNNI__": "avx512_vnni",
    "__AVX512VBMI__": "avx512vbmi",
    "__AVX512VBMI2__": "avx512_vbmi2",
    "__AMX_TILE__": "amx_tile",
}


def _switch(name):
    value = os.environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        sys.exit(f"setup.py: {name} should be 0 or 1, got {value!r}")
    return None if value == "" else value == "1"


def _sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob(os.path.join(ROOT, pattern)))


def load_file(path):
    """A module of the package, loaded by path: setup.py runs before the package is built."""
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_arch():
    default = "x86-64-v3" if platform.machine() in ("x86_64", "AMD64") else ""
    return os.environ.get("SPARSECOMM_CPU_ARCH", default).strip()


@functools.cache
def march_macros(compiler="c++"):
    """The macros -march defines (__AVX2__, ...): what the compiler may use. Empty: no -march."""
    arch = cpu_arch()
    if not arch or shutil.which(compiler) is None:
        return frozenset()
    proc = subprocess.run(
        [compiler, f"-march={arch}", "-dM", "-E", "-x", "c++", os.devnull], capture_output=True, text=True
    )
    return frozenset(re.findall(r"#define (\w+) 1", proc.stdout))


def cpu_flags():
    # No floating-point contraction (FMA): kernels round once per operation, so CPU, CUDA, torch,
    # TF and a numpy reference agree bit for bit. OpenMP splits the memory-bound passes. TF's
    # bundled Eigen does not compile with AVX512-FP16 (a native build on Sapphire Rapids).
    # Python's own flags hold -g; the debug info of torch's and TF's headers doubled the compile
    # time, so it is off (-g0, the last -g wins) unless SPARSECOMM_DEBUG_INFO=1.
    arch = cpu_arch()
    no_fp16 = ["-mno-avx512fp16"] if "__AVX512FP16__" in march_macros() else []
    debug = [] if _switch("SPARSECOMM_DEBUG_INFO") else ["-g0"]
    return ["-O3", "-ffp-contract=off", "-fopenmp", *debug] + ([f"-march={arch}"] + no_fp16 if arch else [])


def link_flags():
    # A compiler that links its own libstdc++ statically (a GPU image's /opt/gcc did) would
    # export that copy's symbols, which then mix with the libstdc++ torch loaded: formatting an
    # integer into an error message crashed. Kept private, the copy serves this library alone.
    return ["-fopenmp", "-Wl,--exclude-libs,ALL"]


def cpu_features():
    """The instruction-set extensions the build may execute (AVX512-FP16 is switched off)."""
    return sorted(flag for macro, flag in CPU_FEATURES.items() if macro in march_macros() and macro != "__AVX512FP16__")


def torch_cuda_arch_list(torch):
    """torch's extension builder picks the visible GPUs' architectures, and fails without one
    (a login node): then build for every architecture torch itself was built for."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST") or torch.cuda.is_available():
        return os.environ.get("TORCH_CUDA_ARCH_LIST", "the visible GPUs'")
    built_for = torch.cuda.get_arch_list() or getattr(torch._C, "_cuda_getArchFlags", str)().split()
    archs = sorted({int(a.split("_")[1]) for a in built_for if a.startswith("sm_")})
    if archs:
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(f"{a // 10}.{a % 10}" for a in archs)
    return os.environ.get("TORCH_CUDA_ARCH_LIST", "torch's default")


def torch_extension(info):
    """sparsecomm._C for the installed torch, or None where torch is absent or switched off."""
    if _switch("SPARSECOMM_WITH_TORCH") is False:
        return None
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        if _switch("SPARSECOMM_WITH_TORCH"):
            sys.exit("setup.py: SPARSECOMM_WITH_TORCH=1 but torch does not import\n" + HOW_TO_BUILD)
        return None
    with_cuda = _switch("SPARSECOMM_WITH_CUDA")
    if with_cuda is None:
        with_cuda = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    info["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_kernels": with_cuda}
    cuda_bindings = _sources("csrc/torch/cuda*.cpp")  # compiled only into CUDA builds
    sources = [s for s in _sources("csrc/torch/*.cpp") if s not in cuda_bindings] + _sources("csrc/cpu/*.cpp")
    if not with_cuda:
        return cpp_extension.CppExtension(
            "sparsecomm._C", sources, extra_compile_args={"cxx": cpu_flags()}, extra_link_args=link_flags()
        )
    info["torch"]["cuda_arch_list"] = torch_cuda_arch_list(torch)
    return cpp_extension.CUDAExtension(
        "sparsecomm._C",
        sources + cuda_bindings + _sources("csrc/cuda/*.cu"),
        extra_compile_args={"cxx": cpu_flags(), "nvcc": ["-O3", "--fmad=false"]},
        extra_link_args=link_flags(),
    )


# TF is probed in a child process: its import is slow and must not leak into the build. Its Linux
# wheels are all built with CUDA (a CPU install lacks the libraries): "TF has CUDA" means a GPU too.
TF_PROBE = (
    "import json, tensorflow as tf; print(json.dumps([tf.__version__, tf.sysconfig.get_compile_flags(), "
    "tf.sysconfig.get_link_flags(), tf.test.is_built_with_cuda() and "
    "bool(tf.config.list_physical_devices('GPU'))]))"
)


def tensorflow_extension(info, cuda_home):
    """The TF op library for the installed TensorFlow, or None where TF is absent or switched off."""
    with_tf = _switch("SPARSECOMM_WITH_TF")
    if with_tf is False:
        return None
    result = subprocess.run(
        [sys.executable, "-c", TF_PROBE], capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    )
    if result.returncode != 0:
        if with_tf:
            sys.exit("setup.py: SPARSECOMM_WITH_TF=1 but tensorflow does not import:\n" + result.stderr)
        return None
    version, compile_flags, tf_link_flags, tf_has_cuda = json.loads(result.stdout.strip().splitlines()[-1])
    lib_dirs = [f[2:] for f in tf_link_flags if f.startswith("-L")]
    sources = _sources("csrc/tensorflow/*.cc") + _sources("csrc/cpu/*.cpp")
    cxx_flags = compile_flags + cpu_flags() + ["-Wno-deprecated-declarations"]  # TF headers
    link_args = tf_link_flags + link_flags() + [f"-Wl,-rpath,{d}" for d in lib_dirs]
    with_cuda = _switch("SPARSECOMM_WITH_CUDA")
    with_cuda = tf_has_cuda and cuda_home is not None if with_cuda is None else with_cuda
    info["tensorflow"] = {"version": version, "gpu_kernels": with_cuda}
    if not with_cuda:
        return Extension(
            "sparsecomm.tensorflow._ops",
            sources,
            language="c++",
            extra_compile_args=cxx_flags,
            extra_link_args=link_args,
        )
    if cuda_home is None:
        sys.exit(
            "setup.py: SPARSECOMM_WITH_CUDA=1 but no CUDA toolkit was found (put nvcc on the PATH or set CUDA_HOME)"
        )
    # GPU kernels: GOOGLE_CUDA turns on the GPU registrations; csrc/cuda/*.cu go through nvcc
    # (BuildExt). nvcc's CUDA runtime is linked in statically and kept private, ahead of TF's.
    cudart = [
        f"-L{os.path.join(cuda_home, 'lib64')}",
        "-l:libcudart_static.a",
        "-Wl,--exclude-libs,libcudart_static.a",
        "-ldl",
        "-lrt",
        "-lpthread",
    ]
    ext = Extension(
        "sparsecomm.tensorflow._ops",
        sources,
        language="c++",
        include_dirs=[os.path.join(cuda_home, "include")],
        extra_compile_args=cxx_flags + ["-DGOOGLE_CUDA=1"],
        extra_link_args=cudart + link_args,
    )
    ext.nvcc, ext.nvcc_sources = os.path.join(cuda_home, "bin", "nvcc"), _sources("csrc/cuda/*.cu")
    default_arch = "native" if tf_has_cuda else "all-major"
    ext.nvcc_arch = os.environ.get("SPARSECOMM_CUDA_ARCH", default_arch)
    info["tensorflow"]["cuda_arch"] = ext.nvcc_arch
    return ext


# torch's BuildExtension (its nvcc rules and ABI flags) where torch is installed; setuptools'
# otherwise (a TF-only build). CUDA_HOME is set first: torch reads it once, on import.
CUDA_HOME = load_file("sparsecomm/cuda_toolkit.py").find_cuda_home()
if CUDA_HOME:  # a $CUDA_HOME without the headers (e.g. /usr/local) could not build anything
    os.environ["CUDA_HOME"] = CUDA_HOME
try:
    from torch.utils.cpp_extension import BuildExtension as _BaseBuildExt
except ImportError:
    _BaseBuildExt = build_ext


# Commands that only describe or package the sources: they set build_ext up (to list its sources)
# but never run it, so they need not import the frameworks (TF's probe is a 3-4 s process).
DESCRIBING_COMMANDS = {"sdist", "egg_info", "dist_info"}


class BuildExt(_BaseBuildExt):
    """Decides what to build for the frameworks present (when the command is set up, before
    setuptools prepares its extensions), records it in _build_info.json beside the package,
    and compiles the TF library's .cu sources. An sdist or a metadata step keeps the
    placeholders and never runs it."""

    def finalize_options(self):
        if set(self.distribution.commands) <= DESCRIBING_COMMANDS:
            self.build_info = {}
            return super().finalize_options()
        self.build_info = {
            "sparsecomm": VERSION,
            "python": platform.python_version(),
            "cpu_arch": cpu_arch() or None,
            "cpu_features": cpu_features(),
            "cuda_home": CUDA_HOME,
        }
        built = [
            e
            for e in (torch_extension(self.build_info), tensorflow_extension(self.build_info, CUDA_HOME))
            if e is not None
        ]
        if built:  # else the placeholders stay, and run() stops with the message
            self.distribution.ext_modules = built
        super().finalize_options()

    def run(self):
        if "torch" not in self.build_info and "tensorflow" not in self.build_info:
            sys.exit("setup.py: " + HOW_TO_BUILD)
        super().run()
        with open(self._info_path(), "w") as f:
            json.dump(self.build_info, f, indent=1)

    def _info_path(self):
        return os.path.join(os.path.dirname(self.get_ext_fullpath("sparsecomm._C")), "_build_info.json")

    def get_outputs(self):
        return super().get_outputs() + [self._info_path()]

    def build_extension(self, ext):
        for source in getattr(ext, "nvcc_sources", []):  # always recompiled: their headers are not tracked
            obj = os.path.join(self.build_temp, "nvcc", os.path.basename(source) + ".o")
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            self.spawn(
                [
                    ext.nvcc,
                    "-c",
                    f"-arch={ext.nvcc_arch}",
                    "-std=c++17",
                    "-O3",
                    "--fmad=false",
                    "-Xcompiler",
                    "-fPIC",
                    os.path.join(ROOT, source),
                    "-o",
                    obj,
                ]
            )
            ext.extra_objects.append(obj)
        super().build_extension(ext)


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


setup(
    name="sparsecomm",
    version=VERSION,
    description="Sparse gradient compression (DGC, gradient dropping, rTop-k, random-block, SparDL) "
    "for Horovod with PyTorch and TensorFlow",
    long_description=read("README.md"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["sparsecomm", "sparsecomm.*"]),
    python_requires=">=3.10",
    install_requires=["numpy>=1.26,<3"],
    extras_require={
        "torch": ["torch>=2.1"],
        "tensorflow": ["tensorflow>=2.16", "tf-keras"],
        "test": ["pytest>=8,<10", "scikit-learn>=1.5,<2", "mpi4py>=3"],
    },
    # Placeholders: BuildExt.run decides what to build. They make the wheel platform-specific.
    ext_modules=[Extension("sparsecomm._C", []), Extension("sparsecomm.tensorflow._ops", [])],
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
