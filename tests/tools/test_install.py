"""sparsecomm installed as a user installs it: the sdist of this checkout, installed (not
editable) with the command docs/install.md gives, into fresh virtual environments that hold
only a framework and Horovod: torch 2.13 (CPU), TensorFlow without torch, and the CUDA build of
torch 2.14.1 (its CUDA kernels compile here; nothing runs them without a GPU). Each runs from a
folder outside the checkout, so only the installed package can be imported.

The frameworks are installed once per machine, each into an environment kept in the cache folder
(`framework_layer`), which the fresh environments reach through a .pth file; Horovod, the build
tools and sparsecomm are installed into each fresh environment, and the sdist's compiles go
through ccache (tests/compile_cache.py). The three environments are built side by side."""

import concurrent.futures
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

import compile_cache
import pytest
from build_driver import cached_path
from launch import LAUNCHES
from paths import ROOT
from setuptools import find_packages

from sparsecomm import install_horovod
from sparsecomm.check.report import PASS

USER_SCRIPTS = os.path.join(ROOT, "tests", "install")
INSTALL = ["install", "--no-cache-dir", "--no-build-isolation"]  # docs/install.md's command, before the sdist


def run(cmd, *, cwd, env=None, timeout=1200, check=True):
    """Runs a command outside the checkout; fails the test with its output's end when check is set."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}")
    return proc


def venv_env(venv):
    """The environment of a user who activated `venv`: its bin first, nothing of this one's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(os.path.dirname(sys.executable))]
    env.update(
        PATH=os.pathsep.join([os.path.join(venv, "bin")] + path),
        VIRTUAL_ENV=str(venv),
        TF_CPP_MIN_LOG_LEVEL="3",
        OMP_NUM_THREADS="1",
    )
    return env


def checkout_files(*folders):
    """Every file of the checkout under `folders` (git's list where there is one)."""
    if os.path.isdir(os.path.join(ROOT, ".git")):  # tracked files and new ones not ignored
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", *folders],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        return {line for line in out.stdout.splitlines() if os.path.exists(os.path.join(ROOT, line))}
    return {
        os.path.relpath(os.path.join(d, f), ROOT)
        for folder in folders
        for d, _, files in os.walk(os.path.join(ROOT, folder))
        for f in files
    }


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    """The sdist, built from a copy of the checkout's files: a checkout's build leftovers
    (an egg-info's SOURCES.txt) would add files the MANIFEST.in leaves out."""
    tree, out = tmp_path_factory.mktemp("tree"), tmp_path_factory.mktemp("sdist")
    for name in checkout_files("."):
        os.makedirs(tree / os.path.dirname(name), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), tree / name)
    run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", out, tree], cwd=out, timeout=300)
    (found,) = glob.glob(str(out / "sparsecomm-*.tar.gz"))
    return found


def test_every_package_folder_is_packaged():
    """A folder of sparsecomm/ with Python files but no __init__.py is left out of every wheel."""
    wanted = {
        os.path.relpath(d, ROOT).replace(os.sep, ".")
        for d, _, files in os.walk(os.path.join(ROOT, "sparsecomm"))
        if any(f.endswith(".py") for f in files) and "__pycache__" not in d
    }
    assert wanted - set(find_packages(ROOT, include=["sparsecomm", "sparsecomm.*"])) == set()


def test_the_sdist_holds_every_file_the_build_reads(sdist):
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    wanted = checkout_files("csrc", "sparsecomm") | {"setup.py", "pyproject.toml", "MANIFEST.in", "README.md"}
    assert sorted(wanted - names) == []


def horovod_wheel():
    """The Horovod wheel `make env` built for this environment (install_horovod's cache)."""
    cache = install_horovod.default_cache()
    wheels = glob.glob(
        os.path.join(cache, "wheels", install_horovod.cache_key(install_horovod.probe_frameworks()), "horovod-*.whl")
    )
    if not wheels:
        pytest.skip(f"no Horovod wheel cached under {cache}/wheels (make env builds it)")
    return wheels[0]


def framework_layer(*packages):
    """The site-packages folder of an environment holding `packages` (a framework and what Horovod
    needs at run time), built once per machine for each set of them and kept in the cache folder:
    installing torch's CUDA build alone writes 5.4 GB. Sets unused for a day are removed."""
    key = hashlib.sha256("\0".join([sys.version, *packages]).encode()).hexdigest()[:16]
    layer = cached_path(os.path.join(install_horovod.default_cache(), "install_layers"), key, "venv")
    if not os.path.exists(os.path.join(layer, "complete")):
        partial = f"{layer}.{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        run([sys.executable, "-m", "venv", partial], cwd=os.path.dirname(partial))
        run([os.path.join(partial, "bin", "python"), "-m", "pip", "install", "-q", *packages], cwd=partial)
        open(os.path.join(partial, "complete"), "w").close()
        try:
            os.rename(partial, layer)
        except OSError:  # another session's build got there first
            shutil.rmtree(partial, ignore_errors=True)
    (site,) = glob.glob(os.path.join(layer, "lib", "python*", "site-packages"))
    return site


def fresh_venv(path, layer, *packages):
    """A new virtual environment at `path` that reaches `layer` (framework_layer) through a .pth file,
    with the build tools and `packages` installed into it; returns its python. Its pip is the layer's,
    the same version as venv's own (both this Python's ensurepip), whose install costs 4 s a venv."""
    run([sys.executable, "-m", "venv", "--without-pip", path], cwd=path.parent)
    (site,) = glob.glob(str(path / "lib" / "python*" / "site-packages"))
    with open(os.path.join(site, "framework_layer.pth"), "w") as f:
        f.write(layer + "\n")
    python = str(path / "bin" / "python")
    run([python, "-m", "pip", "install", "-q", "setuptools>=69", "wheel", *packages], cwd=path, env=venv_env(path))
    return python


def install_sdist(python, venv, sdist, **extra_env):
    """The docs' command, with a pip cache of the venv's own that must stay free of sparsecomm: pip
    keeps a wheel built from an sdist under the sdist's path and installs it in any environment
    (the three builds here share one sdist, so a cached torch build could land in the TF one). pip
    builds in a temporary folder, which ccache's paths are made relative to."""
    cache = venv / "pip-cache"
    env = dict(venv_env(venv), PIP_CACHE_DIR=str(cache), **extra_env)
    env.update(compile_cache.env_for(tempfile.gettempdir(), env["PATH"], unhashed_include=venv / "include"))
    proc = run([python, "-m", "pip", *INSTALL, sdist], cwd=venv, env=env)
    assert glob.glob(str(cache / "**" / "sparsecomm-*.whl"), recursive=True) == [], "pip cached the build"
    return proc


def framework_venv(venv, sdist, framework_pin):
    """A fresh environment at `venv` with one framework, the Horovod wheel and the sdist installed."""
    python = fresh_venv(venv, framework_layer(framework_pin, *install_horovod.RUNTIME_DEPS), horovod_wheel())
    install_sdist(python, venv, sdist)
    return venv, python


def cuda_build(venv, sdist):
    """torch 2.14.1's CUDA build (on this machine kind's disk) and the sdist built against it
    with nvcc: CUDA_HOME comes from the nvcc found; one architecture keeps the build short."""
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc on the PATH: the CUDA build needs the CUDA toolkit")
    python = fresh_venv(venv, framework_layer("torch==2.14.1", "pytest>=8,<10"))
    install_sdist(python, venv, sdist, TORCH_CUDA_ARCH_LIST="9.0")
    return venv, python


@pytest.fixture(scope="module")
def venvs(tmp_path_factory, sdist):
    """The three environments, built side by side as soon as a test needs one (a build is mostly
    one process on one core: pip unpacking and byte-compiling, a compiler). {name: a future of
    (venv, python)}: the fixture that waits for one raises its build's failure or skip."""
    builds = {
        "torch": (framework_venv, tmp_path_factory.mktemp("torch-venv"), sdist, "torch==2.13.0"),
        "tf": (framework_venv, tmp_path_factory.mktemp("tensorflow-venv"), sdist, "tensorflow==2.21.0"),
        "cuda": (cuda_build, tmp_path_factory.mktemp("cuda-venv"), sdist),
    }
    with concurrent.futures.ThreadPoolExecutor(len(builds)) as pool:
        yield {name: pool.submit(*build) for name, build in builds.items()}


@pytest.fixture(scope="module")
def torch_venv(venvs):
    return venvs["torch"].result()


@pytest.fixture(scope="module")
def tf_venv(venvs):
    return venvs["tf"].result()


def horovodrun_2(venv, python, script):
    horovodrun = os.path.join(os.path.dirname(python), "horovodrun")
    out = run(
        [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", python, os.path.join(USER_SCRIPTS, script)],
        cwd=venv,
        env=venv_env(venv),
        timeout=600,
    ).stdout
    assert out.count(": in sync") == 2 and str(venv) in out, out
    return out


def test_a_torch_user_trains_dgc_on_2_ranks_in_sync(torch_venv):
    horovodrun_2(*torch_venv, "user_torch.py")


def test_a_tensorflow_user_without_torch_trains_dgc_on_2_ranks_in_sync(tf_venv):
    venv, python = tf_venv
    assert run([python, "-c", "import torch"], cwd=venv, check=False).returncode != 0  # no torch there at all
    horovodrun_2(venv, python, "user_tf.py")


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_info_reports_the_build_and_its_self_test_passes(framework, torch_venv, tf_venv):
    venv, python = torch_venv if framework == "torch" else tf_venv
    out = run([python, "-m", "sparsecomm.info"], cwd=venv, env=venv_env(venv)).stdout
    assert "(installed)" in out and re.search(rf"{framework} kernels \(cpu\) +PASS", out) and "verdict: OK" in out, out


# `python -m sparsecomm.check --quick`'s steps, in order; the CPU build of torch skips the cuda ones
CHECK_STEPS = [
    "environment",
    "op tests (cpu)",
    "op tests (cuda)",
    "kernel benchmark (cuda)",
    "kernel benchmark (cpu)",
    "DDP hook step (cuda)",
    "DDP hook step (cpu)",
    "2-rank training (cpu)",
    "2-rank training (cuda)",
    "DDP training (cpu)",
    "DDP training (cuda)",
]


def test_the_self_check_runs_from_an_installed_package(torch_venv, tmp_path):
    """`make check` as a user runs it: the table, the JSON and the exit code, the CPU steps PASS
    (the 2-rank horovodrun and torchrun trainings included) and the cuda ones SKIP with the reason.
    No tests/ beside the package (its op tests are the self-test) and nothing of the benchmarks (tqdm)."""
    venv, python = torch_venv
    out = tmp_path / "check.json"
    command = [python, "-m", "sparsecomm.check", "--quick", "--json", str(out)]
    proc = run(command, cwd=venv, env=venv_env(venv), timeout=600, check=False)
    said = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0 and out.exists(), said
    result = {s["step"]: s for s in json.loads(out.read_text())["steps"]}
    LAUNCHES.append(("horovodrun -np 2 --gloo sparsecomm.check.worker", 0, result["2-rank training (cpu)"]["seconds"]))
    assert list(result) == CHECK_STEPS
    table = proc.stdout.rsplit("\nsparsecomm self-check\n", 1)[1]
    for step, r in result.items():
        row = rf"^{re.escape(step)} +{r['status']} +\S+ +{re.escape(r['detail'])}$"
        assert re.search(row, table, re.M), (row, table)
    cuda = [step for step in CHECK_STEPS if "cuda" in step]
    assert all(result[s]["status"] == PASS for s in CHECK_STEPS if s not in cuda), result
    assert all(result[s]["detail"].startswith("no CUDA device (torch.cuda.is_available() is False)") for s in cuda)
    selftest = r"\d+ passed, 0 failed \(python -m sparsecomm.selftest: .*\)"
    assert re.fullmatch(selftest, result["op tests (cpu)"]["detail"]), result
    assert "x a memcpy" in result["kernel benchmark (cpu)"]["detail"]
    hook = result["DDP hook step (cpu)"]["detail"]
    assert re.match(r"161 tensors of 64x64, 1 rank, against DDP's allreduce step: DGC 0.1% \d+\.\d\dx", hook), hook
    assert "ranks bitwise equal" in result["2-rank training (cpu)"]["detail"], result
    assert result["DDP training (cpu)"]["detail"].startswith("Gloo, 2 ranks: DGC/TopK/Threshold/RandomBlock"), result
    verdict = "\nverdict: OK (6 passed, 0 failed, 5 skipped): nothing failed, but these did NOT run here: "
    assert verdict + ", ".join(cuda) + "\n" in table, table


def test_a_plain_isolated_install_stops_early_naming_the_command(torch_venv, sdist):
    venv, python = torch_venv
    proc = run(
        [python, "-m", "pip", "install", "--no-cache-dir", "--force-reinstall", "--no-deps", sdist],
        cwd=venv,
        env=venv_env(venv),
        check=False,
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "pip install --no-cache-dir --no-build-isolation" in said, said


@pytest.fixture(scope="module")
def cuda_venv(venvs):
    return venvs["cuda"].result()


def test_the_cuda_build_reports_cuda_kernels_and_passes_the_cpu_op_tests(cuda_venv):
    venv, python = cuda_venv
    info = run([python, "-m", "sparsecomm.info"], cwd=venv, env=venv_env(venv)).stdout
    assert "CUDA kernels yes (9.0)" in info and re.search(r"torch kernels \(cpu\) +PASS", info), info
    registered = (
        "import torch, sparsecomm.torch; "
        "print(torch._C._dispatch_has_kernel_for_dispatch_key('sparsecomm::block_pack', 'CUDA'))"
    )
    assert run([python, "-c", registered], cwd=venv, env=venv_env(venv)).stdout.strip() == "True"
    tests = [
        os.path.join(ROOT, "tests", "ops", name) for name in ("test_torch_select_ops.py", "test_torch_block_ops.py")
    ]
    out = run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not cuda", *tests], cwd=venv, env=venv_env(venv)
    ).stdout
    assert " passed" in out and " failed" not in out, out


def test_a_build_for_another_torch_names_both_versions(cuda_venv, torch_venv, tmp_path):
    """The torch 2.13 build, imported beside torch 2.14.1: an ImportError naming both."""
    built = glob.glob(os.path.join(torch_venv[0], "lib", "python*", "site-packages", "sparsecomm"))[0]
    shutil.copytree(built, tmp_path / "sparsecomm")
    venv, python = cuda_venv
    proc = run([python, "-c", "import sparsecomm.torch"], cwd=tmp_path, env=venv_env(venv), check=False)
    assert proc.returncode != 0 and "built for torch 2.13.0+cpu, but torch 2.14.1" in proc.stderr, proc.stderr
