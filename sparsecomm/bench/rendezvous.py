"""Horovod's Gloo rendezvous server for ranks started one per network namespace
(sparsecomm.bench.network, per-host model), where horovodrun cannot start them:
`python -m sparsecomm.bench.rendezvous RANKS` serves one host per rank, prints `port N`, and
serves until its stdin closes."""

import sys

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousServer


def host_slots(ranks):
    """Horovod's slots for one rank on each of `ranks` hosts; the server sizes its scopes from
    them, and each rank's HOROVOD_* variables come from its slot."""
    return get_host_assignments(parse_hosts(",".join(f"host{i}:1" for i in range(ranks))), ranks)


def main():
    server = RendezvousServer()
    port = server.start()
    server.init(host_slots(int(sys.argv[1])))
    print(f"port {port}", flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()
