"""What the self-check finds on this machine: torch and its CUDA, the GPUs, sparsecomm's
extension (and whether it carries CUDA kernels), Horovod's backends, TensorFlow, and whether
this is a source checkout with the tests. Also why a cuda step cannot run here, if it cannot."""

import dataclasses
import glob
import importlib.metadata
import json
import os
import platform
import subprocess
import sys

import torch

from .report import FAIL, SKIP

# The op tests the self-check runs, in a source checkout's tests/.
OP_TEST_FILES = (
    "ops/test_torch_select_ops.py",
    "ops/test_torch_wire_ops.py",
    "ops/test_torch_block_ops.py",
    "ops/test_torch_bucket_ops.py",
    "ops/test_torch_sampled_packs.py",
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds sparsecomm/
NO_CUDA = "no CUDA device (torch.cuda.is_available() is False)"


@dataclasses.dataclass
class Environment:
    python: str
    torch: str
    torch_cuda: str | None  # torch.version.cuda: None for a CPU-only torch build
    cuda_warning: str  # what torch said while looking for a GPU (e.g. a driver too old)
    gpus: list[str]  # the GPUs torch can use
    driver_gpus: int  # the NVIDIA GPUs the driver lists (torch may not see them: a CPU-only torch)
    extension_error: str | None  # None when sparsecomm._C loads
    extension_cuda: bool  # the extension registered CUDA kernels
    horovod: str | None
    horovod_error: str
    nccl: int  # horovod.torch.nccl_built(): NCCL's version code, 0 when built without
    gloo: bool
    mpi: bool
    horovod_cuda: bool
    tensorflow: str | None
    tf_ops: bool  # sparsecomm's TF op library is built
    tests: str | None  # the tests directory of a source checkout, None for an installed package


# Run in a child process: this one never opens a CUDA context, which on GPUs in exclusive-process
# mode would lock the ranks out, and a CUDA start-up that crashes or hangs only ends the child.
GPU_PROBE = """
import json, warnings, torch
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    available = torch.cuda.is_available()
gpus = []
for i in range(torch.cuda.device_count() if available else 0):
    p = torch.cuda.get_device_properties(i)
    gpus.append(f"{p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB)")
print(json.dumps({"gpus": gpus, "said": "; ".join(str(w.message).strip().splitlines()[0] for w in caught)}))
"""


def _gpus():
    """(the GPUs torch can use, what torch said while looking)."""
    try:
        proc = subprocess.run([sys.executable, "-c", GPU_PROBE], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return [], "asking torch for its GPUs timed out after 180 s"
    if proc.returncode != 0:
        return [], "asking torch for its GPUs failed: " + (proc.stderr.strip().splitlines() or ["no output"])[-1]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return found["gpus"], found["said"]


def _driver_gpus():
    """NVIDIA GPUs the driver lists, whatever torch can use (0 without the driver)."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def _extension():
    """(error or None, has CUDA kernels)."""
    try:
        from ..torch import ops  # noqa: F401  (loads sparsecomm._C, registering torch.ops.sparsecomm)
    except Exception as error:  # any failure to load is the finding, whatever its type
        return f"{type(error).__name__}: {error}", False
    return None, torch._C._dispatch_has_kernel_for_dispatch_key("sparsecomm::block_pack", "CUDA")


def _horovod():
    """(version, error, nccl, gloo, mpi, cuda)."""
    try:
        import horovod
        import horovod.torch as hvd
    except Exception as error:
        return None, f"{type(error).__name__}: {error}", 0, False, False, False
    return horovod.__version__, "", hvd.nccl_built(), hvd.gloo_built(), hvd.mpi_built(), hvd.cuda_built()


def _version(*distributions):
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


def _tests_dir():
    tests = os.path.join(ROOT, "tests")
    wanted = ("conftest.py", *OP_TEST_FILES)
    return tests if all(os.path.isfile(os.path.join(tests, f)) for f in wanted) else None


def probe():
    gpus, said = _gpus()
    extension_error, extension_cuda = _extension()
    horovod, horovod_error, nccl, gloo, mpi, horovod_cuda = _horovod()
    package = os.path.join(ROOT, "sparsecomm")
    return Environment(
        platform.python_version(),
        torch.__version__,
        torch.version.cuda,
        said,
        gpus,
        _driver_gpus(),
        extension_error,
        extension_cuda,
        horovod,
        horovod_error,
        nccl,
        gloo,
        mpi,
        horovod_cuda,
        _version("tensorflow", "tensorflow-cpu", "tf-nightly"),
        bool(glob.glob(os.path.join(package, "tensorflow", "_ops*.so"))),
        _tests_dir(),
    )


def nccl_version(code):
    """NCCL_VERSION_CODE as x.y.z (major*10000 + minor*100 + patch since 2.9, *1000 before)."""
    major, rest = (code // 10000, code % 10000) if code >= 10000 else (code // 1000, code % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def lines(env):
    """The environment, one item a line, printed before the steps run."""
    yes = {True: "yes", False: "no"}
    return [
        f"python      {env.python}",
        f"torch       {env.torch}, CUDA {env.torch_cuda or 'none (CPU-only build)'}",
        f"GPUs        {', '.join(env.gpus) or 'none that torch can use'}"
        + (f" (the NVIDIA driver lists {env.driver_gpus})" if env.driver_gpus != len(env.gpus) else "")
        + (f" ({env.cuda_warning})" if env.cuda_warning else ""),
        "sparsecomm  "
        + (
            f"extension does NOT load: {env.extension_error}"
            if env.extension_error
            else f"extension loads, CUDA kernels: {yes[env.extension_cuda]}"
        )
        + f"  ({ROOT})",
        "horovod     "
        + (
            f"{env.horovod}: NCCL {nccl_version(env.nccl) if env.nccl else 'no'}, "
            f"Gloo {yes[env.gloo]}, MPI {yes[env.mpi]}, CUDA {yes[env.horovod_cuda]}"
            if env.horovod
            else f"does not import: {env.horovod_error}"
        ),
        "tensorflow  "
        + (f"{env.tensorflow}, sparsecomm TF ops built: {yes[env.tf_ops]}" if env.tensorflow else "not installed"),
        f"tests       {env.tests or 'not found (an installed package, not a source checkout)'}",
    ]


def summary(env):
    """The environment on one line (the table's detail)."""
    backends = [name for name, built in (("NCCL", env.nccl), ("Gloo", env.gloo), ("MPI", env.mpi)) if built]
    hvd = f"horovod {env.horovod} ({', '.join(backends) or 'no backend'})" if env.horovod else "no horovod"
    ext = (
        "extension does NOT load"
        if env.extension_error
        else "extension with CUDA kernels"
        if env.extension_cuda
        else "extension CPU-only"
    )
    return (
        f"torch {env.torch} (CUDA {env.torch_cuda or 'none'}), {len(env.gpus)} GPU(s), {ext}, {hvd}, "
        f"TF {env.tensorflow or 'none'}"
    )


def blocker(env, device):
    """(status, reason) when steps on `device` cannot run here, None when they can."""
    if device == "cuda" and not env.gpus:
        return SKIP, NO_CUDA + _why_no_cuda(env)
    if env.extension_error:
        return FAIL, f"sparsecomm's extension does not load: {env.extension_error}"
    if device == "cuda" and not env.extension_cuda:
        return FAIL, (
            f"{len(env.gpus)} GPU(s) found but sparsecomm's extension has no CUDA kernels: rebuild it "
            "with a CUDA toolkit on the PATH (SPARSECOMM_WITH_CUDA=1 make build)"
        )
    return None


def _why_no_cuda(env):
    if env.cuda_warning:
        return f": {env.cuda_warning}"
    if env.torch_cuda is None and env.driver_gpus:
        return (
            f": torch {env.torch} is a CPU-only build, yet the NVIDIA driver lists {env.driver_gpus} GPU(s): "
            "install a CUDA build of torch"
        )
    return "; torch is a CPU-only build" if env.torch_cuda is None else ""
