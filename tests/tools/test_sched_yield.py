"""The suite's sched_yield (tests/sched_yield.c, preloaded by tests/conftest.py): a process the
suite starts resolves sched_yield to the shim, and each call sleeps at least its 20 us."""

import json
import os
import subprocess
import sys

import pytest

CALLS = 200
PROBE = f"""
import ctypes, json, time
shims = sorted({{line.split()[-1] for line in open("/proc/self/maps") if line.endswith("/sched_yield.so\\n")}})
address = lambda library: ctypes.cast(library.sched_yield, ctypes.c_void_p).value
libc = ctypes.CDLL(None)
start = time.perf_counter()
for _ in range({CALLS}):
    libc.sched_yield()
took = time.perf_counter() - start
print(json.dumps([len(shims), [address(ctypes.CDLL(s)) == address(libc) for s in shims], took]))
"""


@pytest.mark.skipif(os.environ.get("SPARSECOMM_TEST_SCHED_YIELD") == "os", reason="asked for the system's sched_yield")
def test_a_child_process_resolves_sched_yield_to_the_sleeping_shim():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    shims, resolved, took = json.loads(out)
    assert (shims, resolved) == (1, [True]), out
    assert took >= CALLS * 20e-6, out
