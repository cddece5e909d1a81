"""The per-tensor exchange choice of exchange="auto", shared by the torch and TF front ends.

A latency-bandwidth (alpha-beta) model of the three exchanges for one tensor of `numel`
elements on N ranks, each rank sending k elements:

  dense      ring allreduce:  2 (N-1) alpha * fused + 2 (N-1)/N * numel * size * beta
             (fused = min(1, numel * size / FUSION_BYTES): Horovod fuses the dense allreduces
             of a step into buffers of FUSION_BYTES, so a small tensor pays its share of one
             allreduce's latency, not a whole one; a sparse exchange is its own collective)
  allgather  values + indices:   (N-1) alpha + (N-1) * send(k, numel) * beta
             (one gather of wire rows; each rank receives every other rank's k pairs)
  spardl     sparse reduce-scatter (one alltoall, at most ceil(k/N) pairs to each rank) + sparse
             all-gather of the reduced blocks (ceil(k/N) pairs from each rank):
             2 (N-1) alpha + 2 (N-1) * send(ceil(k/N), numel/N) * beta
             (the gather waits for the alltoall)

send(k, numel) is wire.send_bytes: k rows of a 2-byte offset and the value, and a marker row per
65,535 elements of the range (1-/2-bit codes: a 2-byte offset and the code, and a 2-byte count
a bucket).

plus, for the sparse ones, the local work of packing and unpacking. Measured (LocalCost,
what exchange="auto" uses when it measures the cluster itself): this compressor's own pack +
unpack timed on this machine, as a fixed cost per call, a cost per element of the tensor and
one per (index, value) pair unpacked (N k of them). Without a measurement (a Network given by
the user): `PACK_COPIES` copies of the dense tensor at the Network's copy bandwidth.
beta is seconds per byte received by one rank. Costs are seconds per step. The cheaper sparse
exchange is chosen only where it is predicted to take at most SPARSE_AT_MOST of dense's time:
the model's figures are estimates (docs/results.md compares them with measured steps), and
dense sends the exact gradient, so a gain smaller than the model's own error goes to dense.
Every rank must make the same choice, so the inputs are the same on every rank: given by the
user, or measured once and averaged over the ranks.

Overlap. Horovod starts a tensor's exchange as soon as its gradient is ready, while the backward
pass goes on computing the other layers' gradients: the wire time of an exchange that fits in
the rest of the backward is hidden (`hidden` seconds), and only what sticks out of it is paid.
The sparse path's local work runs on the training thread and is always paid. So the choice
compares exposed seconds: dense max(0, wire - hidden) against sparse local + max(0, wire -
hidden). The hidden time of each tensor comes from `hidden_times`: its window (the measured
time from its hand-off to the last gradient's), less what the tensors handed before it still
occupy of the link (one queue, like Horovod's one background thread). With no window (TF, a
network given by the user) hidden is 0: every second of the exchange is paid.
"""

import math
import time
from dataclasses import dataclass

from . import wire

PACK_COPIES = 4.0  # fused pack (about 3 copies at density 0.01, docs/kernels.md) + unpack (1)
FUSION_BYTES = 64 * 1024 * 1024  # Horovod's default fusion buffer (HOROVOD_FUSION_THRESHOLD)
SPARSE_AT_MOST = 0.8  # a sparse exchange must be predicted at least 20% faster than dense to be chosen


@dataclass(frozen=True)
class Network:
    """What the cost model needs to know of the cluster.

    bandwidth: bytes per second one rank receives (e.g. 1.25e8 for 1 Gbit/s Ethernet).
    latency: seconds per message step of a collective (e.g. 5e-5).
    copy_bandwidth: bytes per second of a local memory copy (the sparse methods' own work).
    """

    bandwidth: float
    latency: float
    copy_bandwidth: float = 1e10

    def __post_init__(self):
        for name in ("bandwidth", "latency", "copy_bandwidth"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not value >= 0
                or (name != "latency" and not value > 0)
                or math.isinf(value)
            ):
                raise ValueError(f"Network: {name} should be a finite number > 0 (latency >= 0), got {value!r}")


@dataclass(frozen=True)
class LocalCost:
    """Measured seconds of one compressor's sparse path (pack + unpack of its own selection)
    on this machine: per call, per element of the tensor, and per extra (index, value) pair
    that arrives from another rank and is unpacked."""

    per_call: float
    per_element: float
    per_pair: float

    def seconds(self, numel, extra_pairs):
        return self.per_call + self.per_element * numel + self.per_pair * extra_pairs

    @classmethod
    def fitted(cls, small, large, unpack, memset, pairs):
        """From timings (numel, seconds) of the whole path at two sizes (a line through the two
        points: per call and per element), and of the larger size's unpack of its `pairs`
        against its write pass alone (memset): the scatter's cost per pair. Never below zero."""
        (n1, t1), (n2, t2) = small, large
        per_element = max(0.0, (t2 - t1) / (n2 - n1))
        per_pair = max(0.0, (unpack - memset) / pairs) if pairs else 0.0
        return cls(max(0.0, t1 - per_element * n1), per_element, per_pair)


EXCHANGES = ("dense", "allgather", "spardl")
HIERARCHICAL = "hierarchical"  # auto considers it where the hosts' process sets are registered (Hosts)
SPARSE = ("allgather", "spardl", HIERARCHICAL)  # the sparse exchanges, in choose's order for ties

# Inside a host (the scaling view's hosts of GPUs): NVLink-class, 100 GB/s a GPU, 5 us a message.
HOST_LINK = Network(bandwidth=1e11, latency=5e-6)


@dataclass(frozen=True)
class Hosts:
    """The hosts of a job: `count` hosts of `per_host` ranks, a host's ranks joined by `link`
    (measured over the host's process set by exchange="auto"; HOST_LINK in the scaling view).
    With Hosts, the model's `network` is a host's NIC."""

    count: int
    per_host: int
    link: Network = HOST_LINK


def local_and_wire(numel, k, size, value_size, ranks, network, local=None, hosts=None):
    """(local seconds, wire seconds) per step of each exchange for one tensor (see the module
    docstring); `local` (LocalCost) replaces the copy-bandwidth estimate of the sparse path's own
    work. Dense has no local work of ours: Horovod's allreduce is all wire. With `hosts` (Hosts,
    of `ranks` ranks in all), "hierarchical" too (_on_hosts)."""
    if hosts is not None:
        return _on_hosts(numel, k, size, value_size, hosts, network, local)
    n, beta, alpha = ranks, 1.0 / network.bandwidth, network.latency
    per_rank = math.ceil(k / n)
    if local is None:
        local = PACK_COPIES * numel * size / network.copy_bandwidth
        gathered = reduced = local
    else:  # allgather unpacks the k pairs of each other rank; SparDL sums and unpacks 2 (N-1) blocks of per_rank
        gathered, reduced = local.seconds(numel, (n - 1) * k), local.seconds(numel, 2 * (n - 1) * per_rank)
    return {
        "dense": (
            0.0,
            2 * (n - 1) * alpha * min(1.0, numel * size / FUSION_BYTES) + 2 * (n - 1) / n * numel * size * beta,
        ),
        "allgather": (gathered, (n - 1) * alpha + (n - 1) * wire.send_bytes(k, numel, value_size) * beta),
        "spardl": (reduced, 2 * (n - 1) * alpha + 2 * (n - 1) * _block_bytes(per_rank, numel, n, value_size) * beta),
    }


def _on_hosts(numel, k, size, value_size, hosts, network, local):
    """local_and_wire on H hosts of R ranks, N = H R: `network` is a host's NIC, hosts.link what
    joins the ranks of a host. The flat exchanges run over all N ranks, as on the network model's
    2 x 2 hosts: a ring (dense, allgather) crosses each host's NIC on one of its links, so it
    carries what one rank of a one-NIC-per-rank cluster does; SparDL's alltoall and gather send
    ceil(k/N) pairs between every two ranks, so a host's NIC carries R (N-R) of them each way.
    hierarchical: SparDL over the host's R ranks (host link), an allgather across the hosts of
    R ceil(k/R) pairs a host (the NIC: (H-1) of them in, H-1 message steps), then an allgather
    inside the host of H R ceil(k/R) pairs. Local work as in the flat model (hierarchical
    unpacks about the pairs it receives). With R = 1 the flat terms are local_and_wire's; with
    one host every exchange runs on the host link."""
    host_link = hosts.link
    network = host_link if hosts.count == 1 else network  # one host: every ring link is inside it
    n, r, h = hosts.count * hosts.per_host, hosts.per_host, hosts.count
    beta, alpha, inner = 1.0 / network.bandwidth, network.latency, 1.0 / host_link.bandwidth
    flat = local_and_wire(numel, k, size, value_size, n, network, local)
    per_rank, per_local = math.ceil(k / n), math.ceil(k / r)
    block, local_block = _block_bytes(per_rank, numel, n, value_size), _block_bytes(per_local, numel, r, value_size)
    spardl = 2 * (n - 1) * alpha + 2 * block * (r * (n - r) * beta + (r - 1) * inner)
    flat["spardl"] = (flat["spardl"][0], spardl)
    added = (r - 1) * per_local + h * r * per_local  # pairs a rank adds up
    work = flat["allgather"][0] if local is None else local.seconds(numel, added)
    inside = 2 * (r - 1) * host_link.latency + (r - 1) * (1 + h) * local_block * inner
    across = (h - 1) * alpha + (h - 1) * r * local_block * beta
    flat[HIERARCHICAL] = (work, inside + across)
    return flat


def costs(numel, k, size, value_size, ranks, network, local=None, hidden=0.0, hosts=None):
    """Predicted seconds per step each exchange adds to the step: its local work plus the part of
    its wire time that `hidden` seconds of backward compute do not cover."""
    return {
        e: work + max(0.0, wire - hidden)
        for e, (work, wire) in local_and_wire(numel, k, size, value_size, ranks, network, local, hosts).items()
    }


def host_costs(numel, k, size, value_size, hosts, per_host, network, local=None, host_link=HOST_LINK):
    """costs (nothing hidden) on `hosts` hosts of `per_host` ranks joined inside by `host_link`."""
    return costs(numel, k, size, value_size, hosts * per_host, network, local, hosts=Hosts(hosts, per_host, host_link))


def choose(numel, k, size, value_size, ranks, network, allowed=("dense", *SPARSE), local=None, hidden=0.0, hosts=None):
    """(the allowed exchange to use, every prediction): the cheapest sparse exchange (ties: the
    earlier of SPARSE) where it is predicted within SPARSE_AT_MOST of dense's time, else dense
    (also where dense costs nothing: its wire time is all hidden). "hierarchical" is predicted,
    and so may be chosen, only with `hosts`."""
    predicted = costs(numel, k, size, value_size, ranks, network, local, hidden, hosts)
    sparse = min((e for e in SPARSE if e in allowed and e in predicted), key=predicted.get, default=None)
    if "dense" in allowed and (
        sparse is None or predicted["dense"] == 0.0 or predicted[sparse] > SPARSE_AT_MOST * predicted["dense"]
    ):
        return "dense", predicted
    return sparse, predicted


def hidden_times(tensors, wire_seconds):
    """{name: hidden seconds} for `tensors`, (name, window seconds) pairs: the link is one queue,
    served in the order the gradients were handed over (the longest window first; ties by name,
    so every rank orders alike). A tensor's exchange starts when its gradient is ready or when
    the link is free, whichever is later, and is hidden for what remains of the backward then.
    wire_seconds(name, hidden) -> the wire time of the exchange chosen for it at that hidden
    time (what then occupies the link)."""
    hidden, link_free = {}, -math.inf  # times in seconds before the end of the backward (negative: earlier)
    for name, window in sorted(tensors, key=lambda item: (-item[1], item[0])):
        start = max(-window, link_free)
        hidden[name] = max(0.0, -start)
        link_free = start + wire_seconds(name, hidden[name])
    return hidden


def received_bytes(exchange, numel, k, size, value_size, ranks):
    """Bytes one rank receives per step under each exchange, at most (the model's byte terms)."""
    n = ranks
    if exchange == "dense":
        return 2 * (n - 1) / n * numel * size
    if exchange == "allgather":
        return (n - 1) * wire.send_bytes(k, numel, value_size)
    return 2 * (n - 1) * _block_bytes(math.ceil(k / n), numel, n, value_size)


def _block_bytes(count, numel, blocks, value_size):
    """Bytes of a send of `count` pairs of one of `blocks` blocks of a tensor (SparDL's)."""
    return wire.send_bytes(count, -(-numel // blocks), value_size)


def from_timings(ranks, small_seconds, big_seconds, big_bytes, copy_seconds, per_op_seconds=None):
    """(latency, bandwidth, copy bandwidth) from the measurements of measure_network: a
    1-element allreduce, one of big_bytes (its extra time is the ring's 2 (N-1)/N * big_bytes),
    a local copy of big_bytes, and, where measured, the added time of one more tiny allgather
    in a burst of them (per_op_seconds: N - 1 message steps). A lone collective's time is
    mostly Horovod's cycle and negotiation, which the collectives of a step share: the burst's
    marginal cost is the latency a tensor's exchange adds. Without it, the lone allreduce's
    2 (N - 1) steps give the latency. The front ends average the timings over the ranks first
    (a mean of bandwidths would be endless where one rank's 4 MB allreduce came out no slower
    than its 1-element one), so every rank decides alike."""
    steps = max(ranks - 1, 1)
    latency = small_seconds / (2 * steps) if per_op_seconds is None else per_op_seconds / steps
    bandwidth = (2 * (ranks - 1) / ranks * big_bytes) / max(big_seconds - small_seconds, 1e-9)
    return latency, bandwidth, big_bytes / max(copy_seconds, 1e-9)


def median_seconds(fn, repeats):
    """Median wall time of fn() over `repeats` calls (measure_network's timer)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]
