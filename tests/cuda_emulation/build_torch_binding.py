"""Builds and loads the torch CUDA binding (csrc/torch/cuda.cpp: the CudaDevice policy and the op
bodies of block.h, select.h and quantize.h over it) against the CPU emulation of CUDA, as a
test-only op library: torch.ops.sparsecomm_cuda_emulated, with the schemas of
csrc/torch/ops.cpp, registered on the CPU key (tests/cuda_emulation/torch_binding.cpp).

The launchers are build_driver.py's copies of csrc/cuda/*.cu (launches rewritten), compiled
with the same -ffp-contract=off and -DSC_MAX_BLOCKS=3 as the driver, their CUDA threads fibers
(-DSC_EMU_FIBERS) where the driver's are OS threads. No sanitizer: a sanitized
torch extension would need the runtime preloaded into a second Python process, and
ThreadSanitizer cannot see the synchronisation inside torch's uninstrumented thread pools (false
races); the driver
(tests/ops/test_cuda_emulation.py) runs the launchers under both sanitizers already. -O1 and one
translation unit for ops.cpp + cuda.cpp keep the build short (torch's headers parsed once).

The build goes to a build folder (default: build/cuda_emulation_torch in the repository) and
ninja rebuilds only what changed: about 1 s when nothing did. With `cache` (the suite passes
~/.cache/sparsecomm/cuda_emulation_torch) the library is also kept there under a hash of every
input, so that a fresh clone loads it instead of building it again (about 50 s).

By hand:  python tests/cuda_emulation/build_torch_binding.py [BUILD_DIR]
"""

import fcntl
import glob
import os
import platform
import sys

import build_driver

NAMESPACE = "sparsecomm_cuda_emulated"
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "torch_binding.cpp")
STUBS_INCLUDE = os.path.join(HERE, "include")  # c10/cuda/CUDAGuard.h, CUDAStream.h stand-ins
DEFAULT_BUILD_DIR = os.path.join(build_driver.ROOT, "build", "cuda_emulation_torch")
FLAGS = ["-O1", "-ffp-contract=off", "-DSC_MAX_BLOCKS=3", "-pthread", "-iquote", build_driver.CUDA_DIR]
# CUDA's threads as fibers on the launching thread (the emulation's switch is x86-64 code): no
# sanitizer watches this library, so OS threads would only add a thread switch at every barrier.
if platform.machine() == "x86_64":
    FLAGS.append("-DSC_EMU_FIBERS")


def load(build_dir=DEFAULT_BUILD_DIR, verbose=False, cache=None):
    """Builds (if needed) and loads the library, from `cache` where it holds a build of the same
    inputs; registers sparsecomm's fake kernels for its namespace too (opcheck); returns
    torch.ops.sparsecomm_cuda_emulated."""
    import torch

    from sparsecomm.torch import fakes

    if cache is None:
        _build(build_dir, verbose)
    else:
        ours = [p for p in glob.glob(os.path.join(HERE, "**"), recursive=True) if "__pycache__" not in p]
        key = build_driver.inputs_key(sorted(ours), torch.__version__, sys.version, *FLAGS)
        cached = build_driver.cached_path(cache, key, f"{NAMESPACE}.so")
        if os.path.exists(cached):
            torch.ops.load_library(cached)
        else:  # loaded from build_dir: a second copy would register the ops twice
            build_driver.keep(_build(build_dir, verbose), cached)
    for name, fake in fakes.FAKES.items():
        torch.library.register_fake(f"{NAMESPACE}::{name}")(fake)
    return getattr(torch.ops, NAMESPACE)


def _build(build_dir, verbose):
    """Builds the library into build_dir and loads it; returns its path."""
    from torch.utils import cpp_extension

    os.makedirs(build_dir, exist_ok=True)
    # torch's own lock (a file named "lock") stays behind when a build is killed, and the next
    # build would wait for it forever. Builders here hold a flock instead, which the OS drops
    # with the process, so whoever holds it may remove torch's stale file.
    with open(os.path.join(build_dir, "flock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(build_dir, "lock")):
            os.remove(os.path.join(build_dir, "lock"))
        copies = build_driver.write_emulated_sources(os.path.join(build_dir, "sources"))
        cpp_extension.load(
            name=NAMESPACE,
            sources=[SOURCE, *copies],
            extra_cflags=FLAGS,
            extra_ldflags=["-pthread"],
            extra_include_paths=[STUBS_INCLUDE, build_driver.EMULATION_INCLUDE],
            build_directory=build_dir,
            is_python_module=False,
            verbose=verbose,
        )
    return os.path.join(build_dir, f"{NAMESPACE}.so")


if __name__ == "__main__":
    sys.path.insert(0, build_driver.ROOT)  # sparsecomm
    ops = load(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_BUILD_DIR, verbose=True)
    print(ops)
