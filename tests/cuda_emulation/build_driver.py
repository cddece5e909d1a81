"""Builds tests/cuda_emulation/driver.cpp with the CUDA launchers (csrc/cuda/*.cu) compiled by
g++ against the CPU emulation (csrc/emulation/cuda_emulation.h) and the CPU launchers
(csrc/cpu/*.cpp), in one sanitizer variant.

The only rewrite of a .cu is its launches, `k<<<grid, block, shared, stream>>>(args)` ->
`::sc_emu::launch("k", k, grid, block, shared, stream)(args)`, into a temporary copy whose
`#line` keeps compiler and sanitizer messages pointing at the real file and line.

By hand:  python tests/cuda_emulation/build_driver.py tsan /tmp/emu-tsan  (then /tmp/emu-tsan/driver --list)
"""

import concurrent.futures
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CUDA_DIR = os.path.join(ROOT, "csrc", "cuda")
CUDA_SOURCES = sorted(glob.glob(os.path.join(CUDA_DIR, "*.cu")))
# Not emulated, with the reason. sort.cu is built on cub's device-wide radix sort and scan
# (NVIDIA's library, whose block-level primitives this emulation does not provide); its own three
# small kernels (iota, magnitude, gather) are only compile-checked (nvcc) until a GPU runs them.
NOT_EMULATED = {"sort.cu": "cub device-wide sorts and scans"}
EMULATED_SOURCES = [s for s in CUDA_SOURCES if os.path.basename(s) not in NOT_EMULATED]
CPU_SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "cpu", "*.cpp")))
DRIVER = os.path.join(ROOT, "tests", "cuda_emulation", "driver.cpp")

# -O1 -g: readable sanitizer stacks at a bearable speed. -ffp-contract=off like the real build
# (setup.py / nvcc --fmad=false), so float results are comparable bit for bit. The CPU
# launchers are built without -fopenmp (one thread: ThreadSanitizer cannot see OpenMP's own
# synchronisation). SC_MAX_BLOCKS=3 makes small inputs run the grid-stride loops.
COMMON_FLAGS = [
    "-std=c++20",
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-ffp-contract=off",
    "-DSC_MAX_BLOCKS=3",
    "-pthread",
]
VARIANTS = {
    "tsan": ["-fsanitize=thread"],
    # _GLIBCXX_SANITIZE_VECTOR: a read past a std::vector's size but within its capacity (an
    # input list cut from a longer one) is an error too, not only one past the allocation.
    "asan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-D_GLIBCXX_SANITIZE_VECTOR"],
}
EMULATION_INCLUDE = os.path.join(ROOT, "csrc", "emulation", "include")  # its cuda_runtime_api.h

_LAUNCH = re.compile(r"([A-Za-z_]\w*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>")


def rewrite_launches(text):
    """(text with every kernel launch rewritten to the emulation's, number of launches)."""
    rewritten, count = _LAUNCH.subn(lambda m: f'::sc_emu::launch("{m.group(1)}", {m.group(1)}, {m.group(2)})', text)
    if count != text.count("<<<"):
        raise ValueError(f"rewrote {count} launches but the source has {text.count('<<<')} '<<<'")
    return rewritten, count


def write_emulated_sources(out_dir):
    """Writes each emulated csrc/cuda/*.cu to out_dir/<name>.cu.cpp with its launches rewritten, behind a
    `#line` naming the real file; returns the copies' paths. Compile them with -iquote CUDA_DIR
    (their "grid.cuh" and "../kernels/x.h" resolve as from csrc/cuda) and -I EMULATION_INCLUDE.
    A copy whose text has not changed is not rewritten, so that incremental builds stay so."""
    os.makedirs(out_dir, exist_ok=True)
    copies = []
    for source in EMULATED_SOURCES:
        text, _ = rewrite_launches(open(source).read())
        text = f'#line 1 "{source}"\n{text}'
        copy = os.path.join(out_dir, os.path.basename(source) + ".cpp")
        if not os.path.exists(copy) or open(copy).read() != text:
            with open(copy, "w") as f:
                f.write(text)
        copies.append(copy)
    return copies


def inputs_key(files, *extra):
    """A hash of what a build reads: the compiler's version, every file of csrc/ but the TF binding
    and the notes (neither the driver nor the torch binding reads them) and `files` (their paths
    and bytes), and the strings `extra` (flags, versions)."""
    digest = hashlib.sha256(subprocess.run(["g++", "--version"], capture_output=True).stdout)
    unread = os.path.join(ROOT, "csrc", "tensorflow", "")
    sources = [
        path
        for path in glob.glob(os.path.join(ROOT, "csrc", "**"), recursive=True)
        if not path.startswith(unread) and not path.endswith(".md")
    ]
    for path in sorted(sources) + list(files):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                digest.update(os.path.relpath(path, ROOT).encode() + b"\0" + f.read() + b"\0")
    for value in extra:
        digest.update(value.encode() + b"\0")
    return digest.hexdigest()[:20]


def cached_path(cache_root, key, name):
    """Where a build of `name` under `key` is kept in cache_root (it may not be there yet); builds
    under other keys that no session used for a day are removed."""
    for other in glob.glob(os.path.join(cache_root, "*")):
        if os.path.basename(other) != key and time.time() - os.path.getmtime(other) > 86400:
            shutil.rmtree(other, ignore_errors=True)
    os.makedirs(os.path.join(cache_root, key), exist_ok=True)
    os.utime(os.path.join(cache_root, key))  # in use
    return os.path.join(cache_root, key, name)


def keep(fresh, cached):
    """Copies the build `fresh` to `cached`, whole or not at all, for a concurrent session."""
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    shutil.copy2(fresh, f"{cached}.{os.getpid()}")
    os.replace(f"{cached}.{os.getpid()}", cached)


def _compile(args):
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"compile failed: {' '.join(args)}\n{proc.stdout}{proc.stderr}")


def build(variant, out_dir, jobs=None):
    """Builds out_dir/driver for `variant` ('tsan' or 'asan'); returns its path."""
    flags = COMMON_FLAGS + VARIANTS[variant]
    os.makedirs(out_dir, exist_ok=True)
    commands, objects = [], []
    for copy in write_emulated_sources(out_dir):
        obj = copy + ".o"
        commands.append(["g++", *flags, "-I", EMULATION_INCLUDE, "-iquote", CUDA_DIR, "-c", copy, "-o", obj])
        objects.append(obj)
    for source in CPU_SOURCES + [DRIVER]:
        obj = os.path.join(out_dir, os.path.basename(source) + ".o")
        commands.append(["g++", *flags, "-I", EMULATION_INCLUDE, "-c", source, "-o", obj])
        objects.append(obj)
    with concurrent.futures.ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        list(pool.map(_compile, commands))
    binary = os.path.join(out_dir, "driver")
    _compile(["g++", *flags, *objects, "-o", binary])
    return binary


if __name__ == "__main__":
    print(build(sys.argv[1], sys.argv[2]))
