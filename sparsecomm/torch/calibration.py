"""What exchange="auto" measures before it routes (torch): the network, this rank's cost of
the sparse path (sparsecomm.core.cost.LocalCost) and the backward windows it watched, all
averaged over the ranks in one collective."""

import torch

from ..core import cost
from . import exchange, ops
from .state import ParameterState

SIZES = (1 << 12, 1 << 20)  # elements: a small and a large gradient, to split per call from per element


def measure(compressor):
    """The network, the compressor's LocalCost and the watched backward's windows of each bound
    parameter (0 where it was not watched), all averaged over the ranks."""
    names = list(compressor.bound_parameters())  # the same order on every rank
    watched = compressor.planner.auto.backward.windows  # measured only after watching (watch_backward)
    network, timings = exchange.measure_network(
        compressor.collective_set(), time_sparse_path(compressor) + [watched.get(name, 0.0) for name in names]
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
