"""An emulated cluster network on one machine, in one of two models (both need root for
`ip netns` and `tc ... tbf`):

  shared    every rank in ONE network namespace whose loopback is shaped: ranks behind one
            link of that rate (the aggregate), started by horovodrun inside the namespace.
            Unshaped: plain loopback, no namespace.
  per-host  one namespace per host, each joined to a bridge (in a namespace of its own) by a
            veth pair. Both ends are shaped, so every host has its own NIC of that rate in each
            direction: the host's end limits what it sends, the bridge's end what it receives.
            A host holds one rank, or R (ranks_per_host) that talk among themselves over its
            unshaped loopback, as GPUs of one machine do over NVLink or PCIe. The ranks are
            started here, in their host's namespace, with the Gloo environment horovodrun
            would give them (hvd.local_size() is R); Horovod's rendezvous server runs in the
            bridge's namespace. Unshaped: the same veths and bridge without tbf.

Where namespaces cannot be made, `shared` runs on plain, unshaped loopback and says why;
`per_host` raises (`per_host_unavailable` tells beforehand)."""

import contextlib
import itertools
import os
import secrets
import subprocess
import sys
import threading
import time

RATES = {"1gbit": 1.25e8, "10gbit": 1.25e9}  # bytes per second
MODELS = ("per-host", "shared")
SUBNET = "10.77.0"  # inside the namespaces only: it cannot clash with the machine's own networks
BRIDGE_ADDRESS = f"{SUBNET}.254"
IFACE = "eth0"  # every rank's NIC has this name, in its own namespace
_RUN_IDS = itertools.count()


def _run(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def _why(error):
    return (getattr(error, "stderr", "") or str(error)).strip()


def _tbf(namespace, device, rate):
    """Shapes the egress of `device` in `namespace` to `rate` with a token bucket."""
    burst = max(128 * 1024, int(RATES[rate] / 1000))  # about 1 ms of traffic (tbf needs burst >= rate / HZ)
    _run(
        "ip",
        "netns",
        "exec",
        namespace,
        "tc",
        "qdisc",
        "add",
        "dev",
        device,
        "root",
        "tbf",
        "rate",
        rate,
        "burst",
        str(burst),
        "latency",
        "10ms",
    )


# The checkout's root: the ranks run `python -m benchmarks.X` from wherever the bench started.
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
    """The environment of every rank: one thread each, quiet TF, horovodrun on the PATH, the
    benchmarks importable."""
    bin_dir = os.path.dirname(sys.executable)
    path = os.environ.get("PYTHONPATH")
    return dict(
        os.environ,
        PYTHONPATH=REPOSITORY + (os.pathsep + path if path else ""),
        OMP_NUM_THREADS="1",
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONUNBUFFERED="1",
        PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""),
    )


def _follow(procs, stream, marker, log):
    """Reads the ranks' merged output until every rank has exited; forwards the lines holding
    `marker` to `log`; kills the others as soon as one fails (a lone rank would wait forever).
    Returns the last 40 lines."""

    def watch():
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    tail = []
    for line in stream:
        tail = (tail + [line])[-40:]
        if marker in line:
            log("   " + line.split(marker, 1)[1].strip())
    watcher.join()
    return tail


def horovodrun(ranks, module, args, marker, prefix=None, log=print):
    """Runs `python -m module args` on `ranks` local ranks (Gloo), inside `prefix` (a
    namespace) when given; forwards the lines holding `marker` to `log`; raises with the tail
    of the output on failure."""
    bin_dir = os.path.dirname(sys.executable)
    cmd = (prefix or []) + [
        os.path.join(bin_dir, "horovodrun"),
        "-np",
        str(ranks),
        "-H",
        f"localhost:{ranks}",
        "--gloo",
        sys.executable,
        "-m",
        module,
        *args,
    ]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        tail = _follow([proc], proc.stdout, marker, log)
    finally:
        if proc.poll() is None:  # interrupted: horovodrun ends its ranks on SIGTERM
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    if proc.wait() != 0:
        raise RuntimeError(f"horovodrun failed ({module} {' '.join(args[:4])} ...):\n{''.join(tail)}")


class SharedLink:
    """Ranks of one horovodrun behind one link: a namespace's shaped loopback (prefix), or
    plain loopback (prefix None: unshaped)."""

    model = "shared"

    def __init__(self, prefix, rate):
        self.prefix, self.rate = prefix, rate

    def launch(self, ranks, module, args, marker, log=print):
        horovodrun(ranks, module, args, marker, self.prefix, log)


@contextlib.contextmanager
def shaped(rate):
    """Yields the command prefix that runs a command in a fresh namespace whose loopback is
    shaped to `rate` ("1gbit", "10gbit"), or None when rate is None or shaping is not
    possible here (a message says which). The namespace is deleted on exit."""
    if rate is None:
        yield None
        return
    name = f"sparsecomm-{os.getpid()}-{next(_RUN_IDS)}-{rate}"
    try:
        _run("ip", "netns", "add", name)
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"[network] cannot create a network namespace ({_why(error)}): running UNSHAPED instead of {rate}")
        yield None
        return
    try:
        _run("ip", "-n", name, "link", "set", "lo", "up")
        _tbf(name, "lo", rate)
    except (OSError, subprocess.CalledProcessError) as error:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        print(f"[network] cannot shape the namespace's loopback ({_why(error)}): running UNSHAPED instead of {rate}")
        yield None
        return
    try:
        yield ["ip", "netns", "exec", name]
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


class PerHostNics:
    """One namespace per host, each with its own (shaped) NIC on a shared bridge, and
    `ranks_per_host` ranks in it that talk to each other over its unshaped loopback (a host's
    NVLink or PCIe, next to its NIC). build() makes them, remove() deletes every namespace made
    so far (and with them the veths and bridge)."""

    model = "per-host"

    def __init__(self, hosts, rate, ranks_per_host=1):
        if not 1 <= hosts <= 250:
            raise ValueError(f"per-host network: hosts should be 1 to 250, got {hosts}")
        if not 1 <= ranks_per_host <= 64:
            raise ValueError(f"per-host network: ranks_per_host should be 1 to 64, got {ranks_per_host}")
        tag = f"sparsecomm-{os.getpid()}-{next(_RUN_IDS)}-{secrets.token_hex(2)}"  # unique per run
        self.ranks, self.ranks_per_host, self.rate = hosts * ranks_per_host, ranks_per_host, rate
        self.bridge = f"{tag}-bridge"
        self.hosts = [f"{tag}-host{i}" for i in range(hosts)]
        self.created = []

    def _add_namespace(self, name):
        _run("ip", "netns", "add", name)
        self.created.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def build(self):
        self._add_namespace(self.bridge)
        _run("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.bridge, "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", "br0")
        _run("ip", "-n", self.bridge, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts):
            port = f"port{i}"  # the bridge's end of host i's veth
            self._add_namespace(host)
            # made inside the host's namespace, peer moved straight to the bridge's: no name
            # ever appears in the machine's own namespace
            _run("ip", "-n", host, "link", "add", IFACE, "type", "veth", "peer", "name", port, "netns", self.bridge)
            _run("ip", "-n", self.bridge, "link", "set", port, "master", "br0", "up")
            _run("ip", "-n", host, "addr", "add", f"{self.address(i)}/24", "dev", IFACE)
            _run("ip", "-n", host, "link", "set", IFACE, "up")
            if self.rate is not None:
                _tbf(host, IFACE, self.rate)  # what the rank sends
                _tbf(self.bridge, port, self.rate)  # what it receives

    def remove(self):
        for name in reversed(self.created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.created = []

    @staticmethod
    def address(rank):
        return f"{SUBNET}.{rank + 1}"

    def _start_rendezvous(self):
        """Horovod's rendezvous server in the bridge's namespace, reachable from every host;
        returns the process and its port."""
        server = subprocess.Popen(
            ["ip", "netns", "exec", self.bridge, sys.executable, "-m", "benchmarks.rendezvous"]
            + [str(len(self.hosts)), str(self.ranks_per_host)],
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = server.stdout.readline()
        if not line.startswith("port "):
            server.kill()
            raise RuntimeError(f"the rendezvous server did not start (said {line!r})")
        return server, int(line.split()[1])

    def _rank_envs(self, port):
        """What horovodrun's Gloo launcher gives each rank (its own functions): host i holds ranks
        i * ranks_per_host onwards, so HOROVOD_LOCAL_SIZE is ranks_per_host."""
        from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars

        from .rendezvous import host_slots

        slots = host_slots(len(self.hosts), self.ranks_per_host)
        common = {k: str(v) for k, v in create_run_env_vars(BRIDGE_ADDRESS, [IFACE], port).items()}
        return [dict(_env(), **common, **create_slot_env_vars(slot), SPARSECOMM_NIC=IFACE) for slot in slots]

    def _rank_command(self, rank):
        """The prefix that runs a command as rank `rank`: in its host's namespace, with the host's
        address as hostname (own UTS namespace). Horovod 0.28.1 builds the Gloo device of its
        process sets from the hostname, not from HOROVOD_GLOO_IFACE; the machine's name resolves
        to 127.0.0.1, which from a namespace of its own reaches no other rank. An address
        resolves to itself."""
        return [
            "ip",
            "netns",
            "exec",
            self.hosts[rank // self.ranks_per_host],
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            self.address(rank // self.ranks_per_host),
        ]

    def launch(self, ranks, module, args, marker, log=print):
        """Runs `python -m module args` once per rank, in its host's namespace, as one Gloo job."""
        if ranks != self.ranks:
            raise ValueError(f"this network has {self.ranks} ranks, not {ranks}")
        server, port = self._start_rendezvous()
        read, write = os.pipe()  # one stream for all ranks, like horovodrun's
        procs = []
        try:
            with os.fdopen(read, "r", errors="replace") as stream:
                for rank, env in enumerate(self._rank_envs(port)):
                    procs.append(
                        subprocess.Popen(
                            self._rank_command(rank) + [sys.executable, "-m", module, *args],
                            env=env,
                            stdout=write,
                            stderr=subprocess.STDOUT,
                        )
                    )
                os.close(write)
                write = None
                tail = _follow(procs, stream, marker, log)
        finally:
            if write is not None:
                os.close(write)
            for proc in procs + [server]:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        if any(p.returncode != 0 for p in procs):
            codes = [p.returncode for p in procs]
            raise RuntimeError(
                f"per-host ranks failed (exit codes {codes}; {module} {' '.join(args[:4])} ...):\n{''.join(tail)}"
            )


@contextlib.contextmanager
def per_host(rate, hosts, ranks_per_host=1):
    """Yields a PerHostNics of `hosts` hosts of `ranks_per_host` ranks at `rate` (None: unshaped
    veths); removes it on exit, also when building or running failed."""
    network = PerHostNics(hosts, rate, ranks_per_host)
    try:
        network.build()
        yield network
    finally:
        network.remove()


def per_host_unavailable():
    """None where a per-host network can be built here, else why not."""
    try:
        with per_host("1gbit", 2):
            return None
    except (OSError, subprocess.CalledProcessError) as error:
        return _why(error)


@contextlib.contextmanager
def emulated(model, rate, ranks, ranks_per_host=1):
    """Yields where to launch `ranks` ranks: a PerHostNics (hosts of `ranks_per_host` ranks) or a
    SharedLink at `rate`."""
    if ranks_per_host != 1 and (model != "per-host" or ranks % ranks_per_host):
        raise ValueError(
            f"ranks_per_host={ranks_per_host}: needs the per-host model and ranks a multiple of it, "
            f"got the {model} model and {ranks} ranks"
        )
    if model == "per-host":
        with per_host(rate, ranks // ranks_per_host, ranks_per_host) as network:
            yield network
    elif model == "shared":
        with shaped(rate) as prefix:
            yield SharedLink(prefix, rate if prefix is not None else None)
    else:
        raise ValueError(f"network model {model!r}: one of {MODELS}")
