"""The build itself: Horovod's capabilities in the project environment, and a compile check
of every CUDA source (nvcc -c, no GPU needed) and of the torch and TF GPU bindings wherever nvcc
exists."""

import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sys

import compile_cache
import pytest
from paths import ROOT

from sparsecomm import install_horovod

CUDA_SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
# The torch bindings compiled only into CUDA builds (setup.py's rule).
CUDA_BINDINGS = sorted(glob.glob(os.path.join(ROOT, "csrc", "torch", "cuda*.cpp")))
# The TF op families: their GPU kernels are compiled in with -DGOOGLE_CUDA=1 (setup.py's rule).
TF_FAMILIES = sorted(glob.glob(os.path.join(ROOT, "csrc", "tensorflow", "*.cc")))


def _cuda_include():
    """The CUDA toolkit's include folder, or None."""
    from torch.utils import cpp_extension

    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), cpp_extension.CUDA_HOME, "/usr/local/cuda"]
    return next(
        (
            os.path.join(h, "include")
            for h in homes
            if h and os.path.exists(os.path.join(h, "include", "cuda_runtime.h"))
        ),
        None,
    )


def _nvcc(source, folder):
    arch = os.environ.get("SPARSECOMM_CUDA_ARCH", "sm_90")
    return ["nvcc", f"-arch={arch}", "-std=c++17", "-O3", "--fmad=false", "-Werror", "all-warnings"] + _object(
        source, folder
    )


def _object(source, folder):
    """Where a compile check writes its object: compiled, not only parsed, so that ccache keeps it."""
    return ["-c", source, "-o", str(folder / (os.path.basename(source) + ".o"))]


def _stub_folder():
    """A CPU torch wheel lacks one generated header of c10/cuda: a stub of it, in a folder whose path
    stays the same from run to run (ccache hashes the include paths outside the checkout)."""
    folder = os.path.join(install_horovod.default_cache(), "compile_checks")
    stub = os.path.join(folder, "c10", "cuda", "impl", "cuda_cmake_macros.h")
    if not os.path.exists(stub):
        os.makedirs(os.path.dirname(stub), exist_ok=True)
        with open(f"{stub}.{os.getpid()}", "w") as f:
            f.write("#pragma once\n")
        os.replace(f"{stub}.{os.getpid()}", stub)
    return folder


def _torch_binding(source, folder, cuda_include):
    """Compiled without linking: a CPU torch wheel lacks one generated header (stubbed) and the CUDA libraries."""
    import sysconfig

    from torch.utils import cpp_extension

    cmd = ["g++", "-std=c++20", "-Wall", "-Werror", f"-I{_stub_folder()}", f"-I{cuda_include}"]
    cmd += [f"-I{sysconfig.get_paths()['include']}"] + [f"-I{p}" for p in cpp_extension.include_paths()]
    return cmd + _object(source, folder)


def _tf_gpu_kernels(source, folder, cuda_include):
    """TF's headers as system headers (their own warnings are not ours); -std=c++20 as torch's
    BuildExtension builds the TF library."""
    import tensorflow as tf

    flags = []
    for flag in tf.sysconfig.get_compile_flags():
        flags += ["-isystem", flag[2:]] if flag.startswith("-I") else [flag]
    cmd = ["g++", *flags, "-std=c++20", "-Wall", "-Werror", "-DGOOGLE_CUDA=1", "-isystem", cuda_include]
    return cmd + _object(source, folder)


def _commands(folder):
    """What this file runs that this machine can run: {(check, source): command}; Horovod's
    --check-build first (the longest)."""
    checks = {
        ("horovodrun", "--check-build"): [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "--check-build"]
    }
    if shutil.which("nvcc") is None:
        return checks
    checks.update({("nvcc", s): _nvcc(s, folder) for s in CUDA_SOURCES})
    cuda_include = _cuda_include()
    if cuda_include is not None:
        checks.update({("torch", s): _torch_binding(s, folder, cuda_include) for s in CUDA_BINDINGS})
        try:
            import tensorflow  # noqa: F401
        except ImportError:
            return checks
        checks.update({("tf", s): _tf_gpu_kernels(s, folder, cuda_include) for s in TF_FAMILIES})
    return checks


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Every command of this file, run side by side on this machine's cores (each is one process
    on one core, and the suite runs in one): {(check, source): (command, exit code, output)}.
    The tests each read their own."""
    commands = _commands(tmp_path_factory.mktemp("compiled"))

    def run(key, cmd):
        # The compiles go through ccache (tests/compile_cache.py): run from the checkout, they share
        # their objects with a run from another clone.
        shown, env = (cmd, dict(os.environ)) if key[0] == "horovodrun" else compile_cache.command(cmd, ROOT)
        result = subprocess.run(
            shown, capture_output=True, text=True, timeout=300, env=dict(env, TF_CPP_MIN_LOG_LEVEL="3"), cwd=ROOT
        )
        return cmd, result.returncode, result.stdout + result.stderr

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {key: pool.submit(run, key, cmd) for key, cmd in commands.items()}
        return {key: future.result() for key, future in futures.items()}


def _assert_compiled(ran, check, source, skip):
    if (check, source) not in ran:
        pytest.skip(skip)
    cmd, code, output = ran[check, source]
    assert code == 0, f"{' '.join(cmd)}\n{output[-5000:]}"


def test_horovod_has_tensorflow_pytorch_mpi_and_gloo(ran):
    _, _, out = ran["horovodrun", "--check-build"]
    for capability in ("TensorFlow", "PyTorch", "MPI", "Gloo"):
        assert f"[X] {capability}" in out, out


def test_install_horovod_names_what_the_build_does_not_list(ran):
    """make env's check of Horovod's build (install_horovod.check_build), on this build's table."""
    _, _, out = ran["horovodrun", "--check-build"]
    both = {"torch": "2.13.0", "tensorflow": "2.21.0"}  # the frameworks found (their versions unread)
    assert install_horovod.missing_from_build(out, both, mpi=True) == []
    assert install_horovod.missing_from_build(out, both, nccl=True, mpi=True) == ["NCCL"]  # a CPU build
    without_mpi = out.replace("[X] MPI", "[ ] MPI")
    assert install_horovod.missing_from_build(without_mpi, both, mpi=True) == ["MPI"]
    assert install_horovod.missing_from_build(without_mpi, both) == []
    assert install_horovod.missing_from_build(out.replace("[X] PyTorch", "[ ] PyTorch"), both) == ["PyTorch"]


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
def test_cuda_source_compiles(source, ran):
    _assert_compiled(ran, "nvcc", source, "nvcc not found")


NO_HEADERS = "no CUDA toolkit headers found ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda)"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found: CUDA binding check skipped")
@pytest.mark.parametrize("source", CUDA_BINDINGS, ids=os.path.basename)
def test_torch_cuda_binding_compiles(source, ran):
    """Each csrc/torch/cuda*.cpp against torch's CUDA headers (syntax only: a CPU torch wheel
    lacks one generated header, stubbed here, and the CUDA libraries)."""
    _assert_compiled(ran, "torch", source, NO_HEADERS)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found: TF GPU kernel check skipped")
@pytest.mark.parametrize("source", TF_FAMILIES, ids=os.path.basename)
def test_tf_gpu_kernels_compile(source, ran):
    """Each csrc/tensorflow/*.cc with its GPU kernels (-DGOOGLE_CUDA=1, as CUDA builds compile
    it) against TF's headers and the CUDA toolkit's, syntax only: the kernel templates are
    instantiated for every registered dtype, but nothing is linked or run."""
    pytest.importorskip("tensorflow")
    _assert_compiled(ran, "tf", source, NO_HEADERS)


@pytest.mark.skipif(os.environ.get("SPARSECOMM_DEBUG_INFO") == "1", reason="SPARSECOMM_DEBUG_INFO=1 keeps it")
def test_the_built_libraries_carry_no_debug_info():
    """setup.py compiles with -g0 (docs/install.md, "Build switches"): Python's own -g made the
    libraries about 15 times larger and their build about twice as long."""
    libraries = glob.glob(os.path.join(ROOT, "sparsecomm", "**", "*.so"), recursive=True)
    assert libraries, "no built library under sparsecomm/ (make build)"
    for library in libraries:
        with open(library, "rb") as f:
            assert b".debug_info" not in f.read(), f"{library} holds a .debug_info section"


@pytest.mark.parametrize(
    "command,probes",
    [(["egg_info"], False), (["dist_info"], False), (["sdist"], False), (["build_ext", "--dry-run"], True)],
    ids=["egg_info", "dist_info", "sdist", "build_ext"],
)
def test_only_a_build_looks_for_tensorflow(command, probes, tmp_path):
    """pip's metadata steps and an sdist set build_ext up but never run it: they must not start
    setup.py's TensorFlow probe (a process importing TF, 3-4 s). A `tensorflow` first on the probe's
    path notes its import, then fails it; the build is the control that the note is seen."""
    fake = tmp_path / "path" / "tensorflow"
    fake.mkdir(parents=True)
    note = tmp_path / "imported"
    (fake / "__init__.py").write_text(f"open({str(note)!r}, 'w').close()\nraise ImportError('not here')\n")
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md"):
        shutil.copy2(os.path.join(ROOT, name), tree / name)
    for folder in ("csrc", "sparsecomm"):
        shutil.copytree(os.path.join(ROOT, folder), tree / folder, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(fake.parent), SPARSECOMM_WITH_TORCH="0")
    out = str(tmp_path / "out")
    os.makedirs(out)
    arguments = {"egg_info": ["--egg-base", out], "dist_info": ["--output-dir", out], "sdist": ["--dist-dir", out]}
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", *command, *arguments.get(command[0], [])],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert note.exists() == probes, proc.stdout[-2000:] + proc.stderr[-2000:]
    if not probes:
        assert proc.returncode == 0, proc.stderr[-3000:]
