"""The self-check's steps. Each returns (status, one-line detail). Every run happens in a child
process with a time limit (pytest, the kernel benchmark's CLI, horovodrun), so a crashed
kernel or a hung rank fails its own step and not the whole check."""

import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile

from . import environment
from .environment import OP_TEST_FILES, ROOT
from .report import FAIL, PASS, SKIP

# (device, quick) -> kernel benchmark sizes, densities, repeats, models. The CPU runs are kept
# small: there they only show the kernels work; the GPU timings are the ones worth reading (and
# the full GPU run times the whole path on ResNet-50's 161 tensors too: what a tensor costs).
BENCH = {
    ("cuda", False): ((1_000_000, 25_557_032), (0.001, 0.01), 7, ("resnet50",)),
    ("cuda", True): ((1_000_000,), (0.01,), 3, ()),
    ("cpu", False): ((1_000_000,), (0.001, 0.01), 3, ()),
    ("cpu", True): ((100_000,), (0.01,), 2, ()),
}
SUMMARY_OPS = (
    ("pack_sampled (estimate + pack + band)", "DGC/Threshold pack"),
    ("pack_topk (exact top-k, EF)", "exact top-k pack"),
)


def child_env():
    """The environment of every child: this sparsecomm first on the path, one thread per rank."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # mpirun (horovodrun --mpi) refuses root without these
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def run_command(cmd, timeout, cwd=None):
    """(exit code, or None on a time-out, combined output). On a time-out the whole process
    group is killed, so no rank or worker is left behind."""
    print("[check] $ " + shlex.join(cmd), flush=True)
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return None, output


def show_tail(output, lines=40):
    """A failing child's last lines, for the person reading the log."""
    print("[check] last lines of its output:\n" + "\n".join(output.rstrip().splitlines()[-lines:]), flush=True)


def op_tests(env, device, quick):
    """The op tests (tests/ops/test_torch_*_ops.py, against plain references) on `device`."""
    blocked = environment.blocker(env, device)
    if blocked:
        return blocked
    if env.tests is None:
        return packaged_self_test(device, 300)
    if importlib.util.find_spec("pytest") is None:
        return SKIP, "pytest is not installed"
    # The real device only: the op tests also run the CUDA binding under the CPU emulation of CUDA
    # (device "cuda-emulated"), which is the test suite's business, not this machine's.
    select = "cuda and not emulated" if device == "cuda" else "not cuda"
    files = [os.path.join(env.tests, f) for f in OP_TEST_FILES]
    timeout = 300 if quick else 900
    code, output = run_command(
        [sys.executable, "-m", "pytest", *files, "-q", "-rf", "-p", "no:cacheprovider", "-k", select], timeout, cwd=ROOT
    )
    counts = re.findall(r"^=*\s*(\d+ (?:passed|failed|error).*?) in [\d.]+s", output, re.M)
    counts = (
        re.sub(r", \d+ deselected", "", counts[-1]) if counts else f"pytest exited {code} without a summary (a crash?)"
    )
    where = f"pytest -k '{select}' tests/{{{','.join(OP_TEST_FILES)}}}"
    if code == 0:
        return PASS, f"{counts} ({where})"
    show_tail(output)
    if code is None:
        return FAIL, f"timed out after {timeout}s ({where})"
    if code == 5:
        return FAIL, f"no test selected ({where}): is the 'device' fixture in tests/conftest.py offering {device}?"
    first = re.search(r"^FAILED (\S+)", output, re.M)
    return FAIL, f"{counts} ({where})" + (f"; first: {first.group(1)}" if first else "")


def packaged_self_test(device, timeout):
    """An installed package has no tests/: its own self-test (sparsecomm.selftest) instead."""
    from ..info import selftest

    result = selftest("torch", device, timeout)
    return result.status, f"{result.detail} (python -m sparsecomm.selftest: no tests/ in an installed package)"


def kernel_bench(env, device, quick):
    """`python -m sparsecomm.check.kernels` on `device`: every kernel against memcpy and
    torch.topk measured in the same run. Timings are reported, not judged."""
    blocked = environment.blocker(env, device)
    if blocked:
        return blocked
    if device == "cpu" and environment.blocker(env, "cuda") is None:
        return SKIP, "benchmarked on cuda instead (the CPU benchmark is for machines without a usable GPU)"
    sizes, densities, repeats, models = BENCH[(device, quick)]
    timeout = 300 if quick else 900
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernels.json")
        code, output = run_command(
            [
                sys.executable,
                "-m",
                "sparsecomm.check.kernels",
                "--device",
                device,
                "--sizes",
                *map(str, sizes),
                "--densities",
                *map(str, densities),
                "--repeats",
                str(repeats),
                "--kernel-models",
                *models,
                "--json",
                path,
            ],
            timeout,
        )
        if code != 0:
            show_tail(output)
            return FAIL, f"the benchmark {'timed out' if code is None else f'exited {code}'}"
        with open(path) as f:
            records = json.load(f)["records"]
    from . import kernels

    print(kernels.table(records), flush=True)
    measured = {(r["numel"], r["density"], r["op"]) for r in records if 0 < r["median_ms"] < math.inf}
    missing = [
        f"{op} at {numel:,}/{density:g}"
        for numel in sizes
        for density in densities
        for op, _ in SUMMARY_OPS
        if (numel, density, op) not in measured
    ]
    invalid = [r["op"] for r in records if not 0 < r["median_ms"] < math.inf]
    if missing or invalid:
        return FAIL, "no valid timing for " + ", ".join(missing + invalid)
    return PASS, bench_summary(records)


def hook_step(env, device, quick):
    """`python -m sparsecomm.check.hook_step` on `device`: each hook's DDP step against DDP's
    allreduce step and its cost per tensor (--quick: on small matrices). Timings are reported, not
    judged."""
    blocked = environment.blocker(env, device)
    if blocked:
        return blocked
    if device == "cpu" and environment.blocker(env, "cuda") is None:
        return SKIP, "measured on cuda instead"
    # --quick: 161 matrices of 64x64 (the hook's own cost, not its kernels' passes over 25.6M elements)
    steps, layout = ("3", "small") if quick else ("10", "resnet50")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "hook_step.json")
        command = [sys.executable, "-m", "sparsecomm.check.hook_step", "--device", device, "--steps", steps]
        command += ["--layout", layout]
        code, output = run_command(command + ["--json", path], 300 if quick else 900)
        if code != 0:
            show_tail(output)
            return FAIL, f"the benchmark {'timed out' if code is None else f'exited {code}'}"
        with open(path) as f:
            records = json.load(f)["records"]
    print(output, flush=True)
    many = [r for r in records if r["tensors"] == 161 and r["method"] != "DDP allreduce"]
    # (the cost per tensor is a difference of differences: 3 quick steps leave it to the noise)
    parts = [
        f"{r['method']} {r['vs_allreduce']:.2f}x" + ("" if quick else f" ({r['us_per_tensor']:+.0f} us a tensor)")
        for r in many
    ]
    shapes = "161 tensors of 64x64" if quick else "ResNet-50's 161 tensors"
    return PASS, f"{shapes}, 1 rank, against DDP's allreduce step: " + ", ".join(parts)


def bench_summary(records):
    """The largest size at the smallest density: the DGC/Threshold pack and the exact top-k
    pack as multiples of a memcpy and against torch.topk, and the copy bandwidth."""
    numel = max(r["numel"] for r in records)
    density = min(r["density"] for r in records if r["numel"] == numel)
    at = {r["op"]: r for r in records if r["numel"] == numel and r["density"] == density}
    parts = []
    for op, label in SUMMARY_OPS:
        r = at[op]
        speedup = r["topk_ms"] / r["median_ms"]
        versus = f"{speedup:.1f}x faster" if speedup >= 1 else f"{1 / speedup:.1f}x slower"
        parts.append(f"{label} {r['median_ms'] / r['memcpy_ms']:.1f}x a memcpy, {versus} than torch.topk")
    copy_gbps = 8 * numel / (at[SUMMARY_OPS[0][0]]["memcpy_ms"] * 1e6)  # a float32 copy reads and writes 4 bytes
    return f"{numel:,} floats at density {density:g}: " + "; ".join(parts) + f"; copy {copy_gbps:.1f} GB/s"


def launch_plan(env, device):
    """(horovodrun controller flag, backend in words) for 2 ranks on `device`, or (None, the
    reason they cannot run here)."""
    if env.horovod is None:
        return None, f"horovod does not import: {env.horovod_error}"
    if not (env.gloo or env.mpi):
        return None, "horovod was built with neither Gloo nor MPI: horovodrun cannot start ranks"
    flag, controller = ("--gloo", "Gloo") if env.gloo else ("--mpi", "MPI")
    if device == "cpu":
        return flag, controller
    if env.nccl:  # Horovod reduces cuda tensors with NCCL, and NCCL refuses two ranks on one GPU
        if len(env.gpus) < 2:
            return None, (
                "horovod reduces cuda tensors with NCCL, which needs one GPU per rank, and only 1 GPU "
                "is visible (2 ranks on one GPU: NCCL 'Duplicate GPU detected')"
            )
        return flag, f"NCCL {environment.nccl_version(env.nccl)}, one GPU per rank"
    if not env.horovod_cuda:
        return None, (
            "horovod was built without CUDA (horovod.torch.cuda_built() is False), so it cannot take cuda "
            "tensors (make env builds it so): rebuild it with HOROVOD_GPU_OPERATIONS=NCCL"
        )
    gpus = "one GPU per rank" if len(env.gpus) >= 2 else "both ranks on GPU 0"
    return flag, f"{controller}, cuda tensors staged through host memory (horovod without NCCL), {gpus}"


def horovodrun_path():
    beside = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return beside if os.path.exists(beside) else shutil.which("horovodrun")


def smoke(env, device, quick):
    """horovodrun -np 2 of sparsecomm.check.worker on `device`: every configuration must
    lower the loss, send fewer bytes than dense, and leave the ranks bitwise equal."""
    blocked = environment.blocker(env, device)
    if blocked:
        return blocked
    flag, backend = launch_plan(env, device)
    if flag is None:
        return SKIP, backend
    horovodrun = horovodrun_path()
    if horovodrun is None:
        return SKIP, "horovodrun is not on the PATH nor beside this python"
    steps, timeout = (10, 240) if quick else (30, 600)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "smoke.json")
        code, output = run_command(
            [
                horovodrun,
                "-np",
                "2",
                "-H",
                "localhost:2",
                flag,
                sys.executable,
                "-m",
                "sparsecomm.check.worker",
                "--device",
                device,
                "--steps",
                str(steps),
                "--out",
                out,
            ],
            timeout,
        )
        return judged(code, output, out, backend, steps)


def ddp_smoke(env, device, quick):
    """torchrun of sparsecomm.check.worker --way ddp on `device` (the DDP hook: Gloo on cpu,
    NCCL on cuda, one GPU per rank, 2 ranks at most): judged as the Horovod smoke test."""
    blocked = environment.blocker(env, device)
    if blocked:
        return blocked
    import torch.distributed as dist

    ranks, backend = 2, "Gloo, 2 ranks"
    if device == "cuda":
        if not dist.is_nccl_available():
            return SKIP, "this torch was built without NCCL"
        ranks = min(2, len(env.gpus))
        backend = f"NCCL, {ranks} rank{'s' * (ranks > 1)} (one GPU each)"
    steps, timeout = (10, 240) if quick else (30, 600)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ddp.json")
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port"]
        worker = ["-m", "sparsecomm.check.worker", "--way", "ddp", "--device", device, "--steps", str(steps)]
        code, output = run_command([*torchrun, str(free_port()), *worker, "--out", out], timeout)
        return judged(code, output, out, backend, steps)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The first line of a rank's own failure: launchers end with their own traceback, which names
# only the rank and its exit code.
RANK_ERROR = re.compile(
    r"^(?:\[rank\d+\]:\s*)?"  # torchrun's prefix of a rank's lines
    r"(?:(?!ChildFailed)\w+(?:Error|Exception): .*|terminate called.*|Fatal Python error.*"
    r"|.*(?:Segmentation fault|Aborted).*)$",
    re.M,
)


def first_rank_error(output):
    found = RANK_ERROR.search(output)
    return found.group(0).strip()[:300] if found else None


def judged(code, output, out, backend, steps):
    """A smoke test's verdict from its launch and the records rank 0 wrote to `out`."""
    if code != 0 or not os.path.exists(out):
        show_tail(output)
        error = first_rank_error(output)
        launch = "timed out" if code is None else f"exited {code}"
        return FAIL, f"{backend}: the launch {launch}" + (f"; first error: {error}" if error else "")
    with open(out) as f:
        records = json.load(f)
    for r in records:
        print(
            f"[check]   {r['config']:<15} loss {r['loss_before']:.4f} -> {r['loss_after']:.4f}, "
            f"ranks equal {r['ranks_equal']}, sent {r['sent_bytes']:,} of {r['dense_bytes']:,} dense bytes, "
            f"exchanges {r['exchanges']}",
            flush=True,
        )
    problems = [p for r in records for p in smoke_problems(r)]
    if problems:
        return FAIL, f"{backend}: " + "; ".join(problems)
    after = [r["loss_after"] for r in records]
    share = max(r["sent_bytes"] / r["dense_bytes"] for r in records if r["exchange"] != "auto")
    methods = "/".join(dict.fromkeys(r["config"].split()[0] for r in records))
    exchanges = "/".join(dict.fromkeys(r["exchange"] or "shared" for r in records))
    return PASS, (
        f"{backend}: {methods} x {exchanges}, {steps} steps each: loss "
        f"{records[0]['loss_before']:.2f} -> {min(after):.2f}..{max(after):.2f}, ranks bitwise equal, "
        f"sent <= {share:.0%} of dense bytes"
    )


def smoke_problems(record):
    """What is wrong with one configuration's record (nothing: an empty list)."""
    name, problems = record["config"], []
    if not record["loss_after"] < record["loss_before"]:  # also catches NaN
        problems.append(f"{name}: loss did not go down ({record['loss_before']:.4f} -> {record['loss_after']:.4f})")
    if not record["ranks_equal"]:
        problems.append(f"{name}: ranks differ (max |difference| {record['max_rank_difference']:.3g})")
    expected = [record["exchange"]] if record["exchange"] else []  # (shared coordinates name no exchange)
    if record["exchange"] == "auto":  # any of its routes, per tensor (one rank has nothing to route)
        expected = [e for e in record["exchanges"] if e in ("dense", "allgather", "spardl")]
        expected = expected or (["a route"] if record["ranks"] > 1 else [])
    if record["exchanges"] != expected:
        problems.append(f"{name}: exchanges used {record['exchanges']}, expected {expected}")
    if record["exchange"] != "auto" and not 0 < record["sent_bytes"] < record["dense_bytes"]:  # auto may go dense
        problems.append(f"{name}: sent {record['sent_bytes']} bytes, not fewer than dense {record['dense_bytes']}")
    return problems
