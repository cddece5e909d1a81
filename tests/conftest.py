import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # `import reference`, `import launch`
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "workers"))  # `import common` (workers' shared code)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cuda_emulation"))  # `import build_torch_binding`
# The checkout's benchmarks/ (test_bench.py, test_scaling.py), last: an installed sparsecomm that a
# test's own pytest runs against (test_install.py) comes first.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import benchmarks  # noqa: E402, F401  (puts the benchmarks' packages on the path: scikit-learn's digits)


def pytest_configure(config):
    _share_digits()
    _preload_sched_yield()
    # OpenMP threads (torch's and the CPU kernels') sleep once their parallel region is done
    # instead of spinning for it: the cores they would spin on run other tests' ranks.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Horovod's background thread cycles every millisecond, idle or not; every 5 ms, a launch's
    # ranks leave more of the cores to the other worker (docs/testing.md).
    os.environ.setdefault("HOROVOD_CYCLE_TIME", "5")


def pytest_unconfigure(config):
    for folder in _DIGITS_FOLDER:
        shutil.rmtree(folder, ignore_errors=True)


_DIGITS_FOLDER = []  # the folder this process saved the digits in, if it did


def _share_digits():
    """The workers' digits (common.digits), saved once a session where every process the suite starts
    reads them: a rank then skips importing scikit-learn. An xdist worker inherits the controller's."""
    import tempfile

    import common

    if os.environ.get(common.DIGITS_FILE) or importlib.util.find_spec("sklearn") is None:
        return
    _DIGITS_FOLDER.append(tempfile.mkdtemp(prefix="sparsecomm-digits-"))
    path = os.path.join(_DIGITS_FOLDER[0], "digits.npz")
    common.save_digits(path)
    os.environ[common.DIGITS_FILE] = path


def _preload_sched_yield():
    """Preloads tests/sched_yield.c into every process the suite starts (ranks, launchers, pip):
    4-6 ranks on 2 cores spend less time spinning (docs/testing.md). SPARSECOMM_TEST_SCHED_YIELD=os
    keeps the system's sched_yield; without a C compiler, so does the suite."""
    if os.environ.get("SPARSECOMM_TEST_SCHED_YIELD") == "os" or "sched_yield" in os.environ.get("LD_PRELOAD", ""):
        return  # asked not to, or an xdist worker that inherited it
    shim = _built_sched_yield()
    if shim:
        os.environ["LD_PRELOAD"] = " ".join(filter(None, [shim, os.environ.get("LD_PRELOAD")]))


def _built_sched_yield():
    """tests/sched_yield.c compiled into the cache folder, once for each version of its source."""
    import hashlib
    import tempfile

    from build_driver import cached_path, keep

    from sparsecomm import install_horovod

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source = os.path.join(os.path.dirname(__file__), "sched_yield.c")
    with open(source, "rb") as f:
        key = hashlib.sha256(f.read()).hexdigest()[:16]
    built = cached_path(os.path.join(install_horovod.default_cache(), "sched_yield"), key, "sched_yield.so")
    if not os.path.exists(built):
        with tempfile.TemporaryDirectory() as scratch:
            subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", f"{scratch}/s.so", source], check=True)
            keep(f"{scratch}/s.so", built)
    return built


# Under pytest-xdist (make test: two workers, --dist loadgroup), the multi-rank tests run as one
# group, one after another on one worker: two multi-rank jobs side by side would each wait on peers
# that the other's ranks keep off the cores. Every other file is a group of its own (a module's
# fixtures run once), handed to whichever worker is free: the tools' files (builds, installs, the
# benchmark's runs) first, then the single-process files, then the LATE multi-rank files, short
# torch launches that a worker out of other work takes beside the group's last launches. The
# elastic files end the group: a failure run's survivors wait out Gloo's time-out, idle time that
# the late files use. (xdist's own xdist_group marks rename node ids, which pytest 9 no longer allows.)
MULTIRANK = "tests/multirank/"
ORDER = (MULTIRANK, "tests/tools/")
LATE = tuple(
    f"{MULTIRANK}test_{name}.py"
    for name in (
        "ddp",
        "ddp_scaled",
        "multirank_spardl",
        "multirank_torch_options",
        "multirank_torch",
        "multirank_torch_state",
        "multirank_torch_loss_scale",
        "multirank_torch_nonfinite",
    )
)
ENDING = (f"{MULTIRANK}test_elastic_keras.py", f"{MULTIRANK}test_elastic.py")


def _group(nodeid):
    """The group of a test: its file for a LATE one, every other multi-rank test one group, any
    other test its file."""
    path = nodeid.split("::")[0]
    return MULTIRANK if path.startswith(MULTIRANK) and path not in LATE else path


def _rank(nodeid):
    """Where a test's group stands in the order the scheduler hands groups out, and where its
    file stands in its group (the ENDING files last)."""
    path = nodeid.split("::")[0]
    if path in LATE:
        return len(ORDER) + 1, 0
    group = next((i for i, prefix in enumerate(ORDER) if nodeid.startswith(prefix)), len(ORDER))
    return group, ENDING.index(path) + 1 if path in ENDING else 0


@pytest.hookimpl(optionalhook=True)  # an environment without xdist runs the op tests too (test_install.py)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return _group(nodeid)

    config.option.loadscopereorder = False  # the groups in collection order (ORDER)
    return Groups(config, log)


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker: its collection sets the groups' order
        items.sort(key=lambda item: _rank(item.nodeid))


# The torch CUDA binding (csrc/torch/cuda.cpp) over the CUDA launchers executed on the CPU
# (tests/cuda_emulation/build_torch_binding.py): a device for the op tests, on CPU tensors.
EMULATED = "cuda-emulated"


def _devices():
    import torch

    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) + [EMULATED]


@pytest.fixture(scope="session")
def cuda_emulated_ops():
    """torch.ops.sparsecomm_cuda_emulated, built into a cached build folder and kept in the cache
    folder of sparsecomm.install_horovod for as long as its inputs stay the same (a fresh clone
    loads it). Skips where there is no compiler; a build error fails the tests that need it."""
    from torch.utils import cpp_extension

    if shutil.which("g++") is None or not cpp_extension.is_ninja_available():
        pytest.skip("the emulated CUDA binding needs g++ and ninja")
    import build_torch_binding

    from sparsecomm import install_horovod

    return build_torch_binding.load(cache=os.path.join(install_horovod.default_cache(), "cuda_emulation_torch"))


def _route(request, binding):
    """The device to put tensors on for `binding`. For the emulated CUDA binding that is the CPU,
    and sparsecomm.torch.ops calls torch.ops.sparsecomm_cuda_emulated until the test ends."""
    if binding != EMULATED:
        return binding
    from sparsecomm.torch import ops

    request.getfixturevalue("monkeypatch").setattr(ops, "_ops", request.getfixturevalue("cuda_emulated_ops"))
    return "cpu"


@pytest.fixture(params=_devices())
def device(request):
    """Where an op test puts its tensors and runs the ops: "cpu", "cuda" (with a GPU), and
    "cuda-emulated" (the test sees "cpu", and the ops go through the emulated CUDA binding)."""
    return _route(request, request.param)


@pytest.fixture(params=["cpu", EMULATED])
def host_binding(request):
    """For op tests written on CPU tensors: runs them through the CPU binding and through the
    emulated CUDA one (use it as @pytest.mark.usefixtures("host_binding"))."""
    return _route(request, request.param)


_LAUNCHED = []  # every test's multi-rank jobs, from whichever process ran it (an xdist worker too)


_STARTED = pytest.StashKey[float]()
_CPU_AT_START = pytest.StashKey[float]()


def _cpu_seconds():
    """CPU seconds of this process and of the children it has waited for (launchers, their ranks)."""
    import resource

    usages = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return sum(usage.ru_utime + usage.ru_stime for usage in usages)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT_START] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test phase's report carries the jobs it launched (tests/launch.py), to the process
    that prints the summary; the teardown's, when the test started (seconds since the epoch) and
    the CPU seconds it used, which the JUnit XML keeps for scripts/suite_profile.py (tests of two
    workers overlap, and the suite is CPU-bound)."""
    from launch import LAUNCHES

    report = (yield).get_result()
    report.user_properties.extend(("launched", list(launch)) for launch in LAUNCHES)
    LAUNCHES.clear()
    if call.when == "setup":
        item.stash[_STARTED] = call.start
    elif call.when == "teardown" and _STARTED in item.stash:
        report.user_properties.append(("started", f"{item.stash[_STARTED]:.3f}"))
        report.user_properties.append(("cpu", f"{_cpu_seconds() - item.stash[_CPU_AT_START]:.2f}"))


def pytest_runtest_logreport(report):
    _LAUNCHED.extend(value for key, value in report.user_properties if key == "launched")


def pytest_terminal_summary(terminalreporter):
    """Lists the multi-rank jobs this run executed, so the log shows them whatever the verbosity."""
    if _LAUNCHED:
        terminalreporter.section("multi-rank runs (real horovodrun and torchrun)")
        for command, status, seconds in _LAUNCHED:
            terminalreporter.write_line(f"{command:<55} exit {status}  {seconds:5.1f}s")


@pytest.fixture
def tf_horovod():
    """horovod.tensorflow, initialized for one in-process test and shut down after it: Horovod
    0.28.1's library of one framework, loaded after the other's hvd.init(), breaks that one's
    process sets ("Horovod has not been initialized"), and a later test of this process may load
    it. mpi4py starts MPI first, so that Horovod's shutdown leaves MPI up for the next init."""
    import horovod.tensorflow as hvd
    from mpi4py import MPI  # noqa: F401

    hvd.init()
    yield hvd
    hvd.shutdown()


@pytest.fixture
def one_thread():
    """The multi-rank workers compute on one thread: so does a simulation compared with them bit
    for bit, for the same float sums."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
