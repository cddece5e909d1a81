"""What exchange="auto" measures before it routes (torch): the network, this rank's cost of
the sparse path (sparsecomm.core.cost.LocalCost) and the backward windows it watched, all
averaged over the ranks in one collective."""

import torch

from ..core import cost
from . import ops
from .state import ParameterState

SIZES = (1 << 12, 1 << 20)  # elements: a small and a large gradient, to split per call from per element


def measure(compressor):
    """The network, the compressor's LocalCost and the watched backward's windows of each bound
    parameter (0 where it was not watched), all averaged over the ranks."""
    names = list(compressor.bound_parameters())  # the same order on every rank
    backward = compressor.planner.auto.backward  # watched first, where the hooks are timed (not under DDP)
    watched = backward.windows if backward is not None else {}
    network, timings = measure_network(
        compressor.collectives,
        time_sparse_path(compressor) + [watched.get(name, 0.0) for name in names],
        compressor.device,
    )
    (small, large, unpack, memset, pairs), windows = timings[:5], timings[5:]
    local = cost.LocalCost.fitted((SIZES[0], small), (SIZES[1], large), unpack, memset, pairs)
    return network, local, dict(zip(names, windows))


def time_sparse_path(compressor):
    """This rank's seconds of pack + unpack (at the final density) on random gradients of the
    two SIZES; at the larger, of the unpack alone and of its write pass alone; and the pairs
    that unpack scattered: LocalCost.fitted's inputs."""
    device = compressor.device
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
    (sparsecomm.torch.collectives): latency from 1-element allreduces, bandwidth from 4 MB ones,
    copy bandwidth from a local copy, the cost of one more collective in flight from bursts of
    tiny allgathers. These timings and this rank's `local` ones are averaged over the ranks (the
    timings, not the bandwidths: one rank whose 4 MB allreduce came out no slower than its
    1-element one would make a mean bandwidth endless), so every rank makes the same choices.
    Its tensors live on `device`, where the gradients do: a GPU's go over NCCL, not the CPU's
    path. Returns (Network, the averaged local timings)."""
    device = torch.device(device)
    small, big = torch.zeros(1, device=device), torch.zeros(1 << 20, device=device)
    counter = iter(range(1 << 30))
    done = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)  # NCCL returns before it ends

    def reduce(t):
        collectives.allreduce(t, f"sparsecomm.measure.{next(counter)}")
        done()

    def burst(count):  # `count` tiny allgathers in flight at once, as a step's exchanges are
        collectives.allgathers(small, count, f"sparsecomm.measure.{next(counter)}")
        done()

    reduce(small)
    t_small, t_big = cost.median_seconds(lambda: reduce(small), 5), cost.median_seconds(lambda: reduce(big), 3)
    t_copy = cost.median_seconds(lambda: (big.clone(), done()), 3)
    per_op = max(0.0, (cost.median_seconds(lambda: burst(16), 3) - cost.median_seconds(lambda: burst(1), 3)) / 15)
    mean = collectives.mean_over_ranks([t_small, t_big, t_copy, per_op, *local], "sparsecomm.measure.mean")
    ranks = collectives.size()
    latency, bandwidth, copy_bandwidth = cost.from_timings(ranks, mean[0], mean[1], big.numel() * 4, mean[2], mean[3])
    return cost.Network(bandwidth=bandwidth, latency=latency, copy_bandwidth=copy_bandwidth), mean[4:]
