"""What exchange="auto" measures before it routes (torch): the network, this rank's cost of
the sparse path (sparsecomm.core.cost.LocalCost), the backward windows it watched and, where the
hosts' process sets are registered, the link inside a host, all averaged over the ranks in one
collective."""

import torch

from ..core import cost
from . import ops
from .state import ParameterState

SIZES = (1 << 12, 1 << 20)  # elements: a small and a large gradient, to split per call from per element
BIG = 1 << 20  # float32 elements of the network's large allreduce


def measure(compressor, device):
    """On `device`, where the gradients are: the network, the compressor's LocalCost, the
    watched backward's windows of each bound parameter (0 where it was not watched), where the
    hosts' process sets are registered the hosts (cost.Hosts, their link timed over this rank's
    host set), and the last watched step's seconds (None where nothing was watched), all
    averaged over the ranks."""
    names = list(compressor.bound_parameters())  # the same order on every rank
    auto = compressor.planner.auto
    backward = auto.backward  # watched first, where the hooks are timed (not under DDP)
    watched = backward.windows if backward is not None else {}
    step = auto.watched_step() if backward is not None else None  # every rank watched, or none
    found = compressor.collectives.hosts()  # (layout, the collectives over this rank's host) or None
    inside = network_timings(found[1], device, "sparsecomm.measure.host") if found else []
    network, timings = measure_network(
        compressor.collectives,
        inside + time_sparse_path(compressor, device) + [step or 0.0] + [watched.get(name, 0.0) for name in names],
        device,
    )
    inside, timings = timings[: len(inside)], timings[len(inside) :]
    (small, large, unpack, memset, pairs, step_seconds), windows = timings[:6], timings[6:]
    local = cost.LocalCost.fitted((SIZES[0], small), (SIZES[1], large), unpack, memset, pairs)
    hosts = None
    if found:
        layout = found[0]
        hosts = cost.Hosts(layout.hosts, layout.per_host, fitted_network(layout.per_host, inside))
    return network, local, dict(zip(names, windows)), hosts, step_seconds if step is not None else None


def time_sparse_path(compressor, device):
    """This rank's seconds of pack + unpack (at the final density) on random gradients of the
    two SIZES; at the larger, of the unpack alone and of its write pass alone; and the pairs
    that unpack scattered: LocalCost.fitted's inputs."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    timings, generator = [], torch.Generator().manual_seed(0)  # its own generator: the global RNG is the user's
    for numel in SIZES:
        grad = torch.randn(numel, generator=generator).to(device)
        out = torch.empty(numel, device=device)
        state = ParameterState.fresh("sparsecomm.calibration")
        unpacked = []

        def path():
            unpacked[:] = unpacked_locally(compressor.pack(grad, state, compressor.method.ratio))
            ops.sparse_unpack(*unpacked, numel, out=out)
            sync()

        path()  # allocates the state
        timings.append(cost.median_seconds(path, 3))
    timings.append(cost.median_seconds(lambda: (ops.sparse_unpack(*unpacked, numel, out=out), sync()), 3))
    timings.append(cost.median_seconds(lambda: (out.zero_(), sync()), 3))
    return timings + [unpacked[1].numel()]


def unpacked_locally(packed):
    """The (values, index) a packed gradient unpacks from (quantized: decoded)."""
    if packed.bits is None:
        return packed.values, packed.index
    return ops.dequantize(packed.codes, packed.scales, packed.index.numel(), packed.bits), packed.index


def measure_network(collectives, local=(), device="cpu"):
    """Measures this cluster for exchange="auto" (once), over the compressor's collectives
    (sparsecomm.torch.collectives): network_timings, averaged over the ranks with this rank's
    `local` ones (the timings, not the bandwidths: one rank whose 4 MB allreduce came out no
    slower than its 1-element one would make a mean bandwidth endless), so every rank makes the
    same choices. Returns (Network, the averaged local timings)."""
    timings = network_timings(collectives, device)
    mean = collectives.mean_over_ranks([*timings, *local], "sparsecomm.measure.mean")
    return fitted_network(collectives.size(), mean[: len(timings)]), mean[len(timings) :]


def network_timings(collectives, device, name="sparsecomm.measure"):
    """Seconds of a 1-element allreduce, of a 4 MB one, of a local copy of 4 MB, and of one more
    tiny allgather in flight in a burst of them (the cost of a collective among a step's others),
    over `collectives`, as collectives named `name`.N (the hosts' sets: names of their own). Its
    tensors live on `device`, where the gradients do: a GPU's go over NCCL, not the CPU's path."""
    device = torch.device(device)
    small, big = torch.zeros(1, device=device), torch.zeros(BIG, device=device)
    counter = iter(range(1 << 30))
    done = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)  # NCCL returns before it ends

    def reduce(t):
        collectives.allreduce(t, f"{name}.{next(counter)}")
        done()

    def burst(count):  # `count` tiny allgathers in flight at once, as a step's exchanges are
        collectives.allgathers(small, count, f"{name}.{next(counter)}")
        done()

    reduce(small)
    t_small, t_big = cost.median_seconds(lambda: reduce(small), 5), cost.median_seconds(lambda: reduce(big), 3)
    t_copy = cost.median_seconds(lambda: (big.clone(), done()), 3)
    per_op = max(0.0, (cost.median_seconds(lambda: burst(16), 3) - cost.median_seconds(lambda: burst(1), 3)) / 15)
    return [t_small, t_big, t_copy, per_op]


def fitted_network(ranks, timings):
    """The Network of network_timings on `ranks` ranks (averaged over the ranks)."""
    latency, bandwidth, copy_bandwidth = cost.from_timings(ranks, timings[0], timings[1], BIG * 4, *timings[2:])
    return cost.Network(bandwidth=bandwidth, latency=latency, copy_bandwidth=copy_bandwidth)
