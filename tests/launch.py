"""Run a worker script on N ranks with the project's own horovodrun (Gloo, localhost)."""
import os
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def horovodrun(np, script, *args, timeout=300):
    """Runs tests/multirank/<script> on np ranks; fails the test with the ranks' output on
    a non-zero exit, and kills the whole process group (no orphaned ranks) on a time-out."""
    horovodrun_exe = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [horovodrun_exe, "-np", str(np), "-H", f"localhost:{np}", "--gloo",
           sys.executable, os.path.join(HERE, "multirank", script), *map(str, args)]
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"horovodrun -np {np} {script} timed out after {timeout}s:\n{output[-6000:]}")
    print(f"$ {' '.join(cmd[:6])} ... {script}  (exit {proc.returncode})")
    if proc.returncode != 0:
        pytest.fail(f"horovodrun -np {np} {script} exited {proc.returncode}:\n{output[-6000:]}")
    return output
