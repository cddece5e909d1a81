"""Horovod's Gloo rendezvous server for ranks started one per network namespace
(benchmarks.network, per-host model), where horovodrun cannot start them:
`python -m benchmarks.rendezvous HOSTS [RANKS_PER_HOST]` serves HOSTS hosts of
RANKS_PER_HOST ranks (default 1), prints `port N`, and serves until its stdin closes."""

import sys

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousServer


def host_slots(hosts, ranks_per_host=1):
    """Horovod's slots for `ranks_per_host` ranks on each of `hosts` hosts (host i holds ranks
    i * ranks_per_host onwards); the server sizes its scopes (global, local, cross) from them,
    and each rank's HOROVOD_* variables come from its slot."""
    layout = ",".join(f"host{i}:{ranks_per_host}" for i in range(hosts))
    return get_host_assignments(parse_hosts(layout), hosts * ranks_per_host)


def main():
    server = RendezvousServer()
    port = server.start()
    server.init(host_slots(*(int(arg) for arg in sys.argv[1:3])))
    print(f"port {port}", flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()
