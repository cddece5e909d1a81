"""An emulated cluster network on one machine: a network namespace whose loopback is shaped
with `tc ... tbf`. Every rank of a horovodrun started inside it talks over that loopback,
so it models ranks behind ONE shared link of that rate (not one NIC per host).

Needs root (ip netns, tc). Where that is not allowed, `shaped` yields None and says why, and
the caller runs on plain, unshaped loopback."""
import contextlib
import os
import subprocess

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
