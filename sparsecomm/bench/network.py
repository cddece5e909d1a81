"""An emulated cluster network on one machine: a network namespace whose loopback is shaped
with `tc ... tbf`. Every rank of a horovodrun started inside it talks over that loopback,
so it models ranks behind ONE shared link of that rate (not one NIC per host).

Needs root (ip netns, tc). Where that is not allowed, `shaped` yields None and says why, and
the caller runs on plain, unshaped loopback."""
import contextlib
import os
import subprocess
import sys

RATES = {"1gbit": 1.25e8, "10gbit": 1.25e9}  # bytes per second


def _run(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def shaped(rate):
    """Yields the command prefix that runs a command in a fresh namespace whose loopback is
    shaped to `rate` ("1gbit", "10gbit"), or None when rate is None or shaping is not
    possible here (a message says which). The namespace is deleted on exit."""
    if rate is None:
        yield None
        return
    name = f"sparsecomm-{os.getpid()}-{rate}"
    burst = max(128 * 1024, int(RATES[rate] / 1000))  # about 1 ms of traffic (tbf needs burst >= rate / HZ)
    try:
        _run("ip", "netns", "add", name)
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        print(f"[network] cannot create a network namespace ({detail.strip()}): running UNSHAPED instead of {rate}")
        yield None
        return
    try:
        _run("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
        _run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate,
             "burst", str(burst), "latency", "10ms")
    except (OSError, subprocess.CalledProcessError) as error:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        detail = getattr(error, "stderr", "") or str(error)
        print(f"[network] cannot shape the namespace's loopback ({detail.strip()}): running UNSHAPED instead of {rate}")
        yield None
        return
    try:
        yield ["ip", "netns", "exec", name]
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def horovodrun(ranks, module, args, marker, prefix=None, log=print):
    """Runs `python -m module args` on `ranks` local ranks (Gloo), inside `prefix` (a
    namespace) when given; forwards the lines holding `marker` to `log`; raises with the tail
    of the output on failure."""
    bin_dir = os.path.dirname(sys.executable)
    cmd = (prefix or []) + [os.path.join(bin_dir, "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}",
                            "--gloo", sys.executable, "-m", module, *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3",
               PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail = []
    for line in proc.stdout:
        tail = (tail + [line])[-40:]
        if marker in line:
            log("   " + line.split(marker, 1)[1].strip())
    if proc.wait() != 0:
        raise RuntimeError(f"horovodrun failed ({module} {' '.join(args[:4])} ...):\n{''.join(tail)}")
