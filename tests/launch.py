"""Run a worker script on N ranks of this host: horovodrun (Gloo) or torchrun; and read back what
the ranks saved."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from paths import WORKERS

# horovodrun's own entry point (horovod.runner.launch.run_commandline, what the horovodrun script
# runs) without its check that Gloo is built: the check starts a process that imports every
# framework's Horovod extension, 4-9 s per launch on this machine, 46 launches a suite.
# tests/tools/test_build.py runs `horovodrun --check-build` once instead.
HOROVODRUN = [
    sys.executable,
    "-c",
    "import horovod.runner.launch as launch; launch.gloo_built = lambda verbose=False: True; launch.run_commandline()",
]
# Two names of this machine that horovodrun runs on without ssh and Horovod tells apart: -H
# localhost:R,127.0.0.1:R holds two hosts of R ranks (hvd.local_size() == R).
LAYOUT_HOSTS = ("localhost", "127.0.0.1")
LAUNCHES = []  # (command summary, exit code, seconds): printed in the test summary (conftest.py)


def horovodrun_outcome(np, script, *args, timeout=300, elastic=None, hosts=None):
    """Runs `script` (a path, or a name in tests/workers/) on np ranks: (exit code, the ranks' output, seconds).
    On a time-out, kills the whole process group (no orphaned ranks) and fails the test. `elastic`: horovodrun's
    elastic arguments (--min-np, --host-discovery-script, ...) instead of -H; Horovod's elastic driver needs the
    loopback interface named here. `hosts`: horovodrun's -H (default localhost:np; LAYOUT_HOSTS makes two hosts
    of this machine). (Gloo's time-out stays at its 30 s: it also bounds how long the ranks wait for a joining rank
    to start, and TF takes 10-20 s to import on this machine.)"""
    if elastic is None:
        where = ["-H", hosts or f"localhost:{np}"]
    else:
        where = [*map(str, elastic), "--network-interface", "lo"]
    cmd = [
        *HOROVODRUN,
        "-np",
        str(np),
        *where,
        "--gloo",
        sys.executable,
        os.path.join(WORKERS, script),
        *map(str, args),
    ]  # join keeps absolute paths
    return _launch(cmd, f"horovodrun -np {np} --gloo {os.path.basename(script)}", timeout)


def torchrun_outcome(np, script, *args, timeout=300):
    """Runs `script` (a path, or a name in tests/workers/) under torchrun on np processes of this
    host (the Gloo backend is the worker's choice): (exit code, the ranks' output, seconds)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(np),
        "--master_port",
        str(free_port()),
        os.path.join(WORKERS, script),
        *map(str, args),
    ]
    return _launch(cmd, f"torchrun --nproc_per_node {np} {os.path.basename(script)}", timeout)


def torchrun(np, script, *args, timeout=300):
    """torchrun_outcome's output; fails the test with the ranks' output on a non-zero exit."""
    code, output, _ = torchrun_outcome(np, script, *args, timeout=timeout)
    if code != 0:
        pytest.fail(f"torchrun --nproc_per_node {np} {script} exited {code}:\n{output[-6000:]}")
    return output


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(cmd, summary, timeout):
    """Runs a launcher's command line in a process group of its own: (exit code, output, seconds).
    On a time-out, kills the whole group (no orphaned ranks) and fails the test."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    started = time.monotonic()
    # The ranks' temporary files go to a folder removed with the launch: TF's autograph writes one
    # per converted function and removes them at exit, which a killed rank never reaches
    # (test_crash.py left about 170 in /tmp per run).
    with tempfile.TemporaryDirectory(prefix="sparsecomm-ranks-") as ranks_tmp:
        env["TMPDIR"] = ranks_tmp
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            LAUNCHES.append((summary, "timed out", time.monotonic() - started))
            pytest.fail(f"{summary} timed out after {timeout}s:\n{output[-6000:]}")
    seconds = time.monotonic() - started
    LAUNCHES.append((summary, proc.returncode, seconds))
    return proc.returncode, output, seconds


def horovodrun(np, script, *args, timeout=300, elastic=None, hosts=None):
    """horovodrun_outcome's output; fails the test with the ranks' output on a non-zero exit."""
    code, output, _ = horovodrun_outcome(np, script, *args, timeout=timeout, elastic=elastic, hosts=hosts)
    if code != 0:
        pytest.fail(f"horovodrun -np {np} {script} exited {code}:\n{first_errors(output)}{output[-6000:]}")
    return output


def first_errors(output):
    """Each rank's first exception line, ahead of the output's tail: the rank that failed first
    is often one whose traceback the tail cuts off (the others then report Horovod's shutdown)."""
    first = {}
    for line in output.splitlines():
        found = re.match(r"\[(\d+)\]<std(?:err|out)>:\s*(\w+(?:\.\w+)*(?:Error|Exception)\b.*)", line)
        if found and found.group(1) not in first:
            first[found.group(1)] = found.group(2)[:300]
    return "".join(f"rank {rank} first raised: {error}\n" for rank, error in sorted(first.items())) + "\n"


def horovodrun_elastic(script, tmp_path, *args, timeout=240):
    """Elastic horovodrun of `script` on 2 to 3 ranks, its --hosts the hosts file (2 slots on localhost
    at first) that the host discovery script prints: horovodrun's output (files in tmp_path)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    elastic = ["--min-np", "2", "--max-np", "3", "--host-discovery-script", discover]
    return horovodrun(2, script, "--hosts", hosts, *args, timeout=timeout, elastic=elastic)


def ranks_fixture(launch, script, *args, **options):
    """A module fixture over 2 and 3 ranks: (the number of ranks, what each rank saved) of `script`
    (saved_ranks' arguments)."""

    @pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
    def run(request, tmp_path_factory):
        return request.param, saved_ranks(tmp_path_factory, launch, request.param, script, *args, **options)

    return run


def sizes_fixture(script, *args, sizes=(2, 3), **options):
    """A module fixture over `sizes`: (the size, what each of its ranks saved) of `script`, every
    size from one horovodrun launch on the largest (saved_sizes), made at the first size's setup."""
    launched = {}

    @pytest.fixture(scope="module", params=sizes, ids=lambda n: f"np{n}")
    def run(request, tmp_path_factory):
        if not launched:
            launched[None] = "tried"  # once: after a failed launch, the other sizes fail without another
            launched.update(saved_sizes(tmp_path_factory, max(sizes), script, sizes, *args, **options))
        if request.param not in launched:
            pytest.fail(f"the launch of {script} for every size failed: see np{sizes[0]}'s error", pytrace=False)
        return request.param, launched[request.param]

    return run


def saved_ranks(tmp_path_factory, launch, np, script, *args, **options):
    """Runs `script` by `launch` (horovodrun or torchrun, with `options`) on np ranks, its --out a new
    folder: what each rank saved there, in rank order (_saved())."""
    out = tmp_path_factory.mktemp(f"{os.path.splitext(os.path.basename(script))[0]}_np{np}")
    launch(np, script, "--out", out, *args, **options)
    return [_saved(out, f"rank{r}") for r in range(np)]


def saved_sizes(tmp_path_factory, np, script, sizes, *args, **options):
    """Runs `script` by horovodrun on np ranks with --sizes (tests/workers/common.py's sizes_of:
    each size in turn on the first N ranks, one launch for all): {size: what each of its ranks
    saved, in rank order}."""
    out = tmp_path_factory.mktemp(f"{os.path.splitext(os.path.basename(script))[0]}_sizes")
    horovodrun(np, script, "--out", out, "--sizes", *sizes, *args, **options)
    return {size: [_saved(out / f"np{size}", f"rank{r}") for r in range(size)] for size in sizes}


def _saved(folder, name):
    """A rank's file `name` in `folder`: name.pt (torch.load), name.npz (its arrays, as a dict) or name.json."""
    if (folder / f"{name}.pt").exists():
        import torch

        return torch.load(folder / f"{name}.pt")
    if (folder / f"{name}.npz").exists():
        import numpy

        return dict(numpy.load(folder / f"{name}.npz"))
    return json.loads((folder / f"{name}.json").read_text())
