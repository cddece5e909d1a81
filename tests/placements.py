"""Process-set layouts for the checks of core.placement: every pair of partitions of the ranks
into the optimizer's and the compressors' process sets, and Horovod's reduction of the markers
simulated (float32 sums, then the op's scaling)."""

import numpy as np

from sparsecomm.core import placement


def partitions(ranks):
    """Every partition of `ranks` into sets (lists), each set sorted."""
    if not ranks:
        yield []
        return
    first, rest = ranks[0], ranks[1:]
    for sets in partitions(rest):
        yield [[first], *sets]
        for i in range(len(sets)):
            yield [*sets[:i], [first, *sets[i]], *sets[i + 1 :]]


def reduced(optimizer_set, compressor_set_of, scale):
    """Horovod's reduction of the markers over `optimizer_set`: float32 sums times `scale`."""
    markers = np.array([placement.marker(r, compressor_set_of[r]) for r in optimizer_set], np.float32)
    return (markers.sum(axis=0) * np.float32(scale)).tolist()


def layouts(size):
    """(optimizer set, {rank: its compressor's set}, [each op scaling's reduced marker]) of every
    pair of partitions of `size` ranks, under Sum, Average and Average with a predivide factor of 2."""
    for optimizer_sets in partitions(list(range(size))):
        for compressor_sets in partitions(list(range(size))):
            compressor_set_of = {r: s for s in compressor_sets for r in s}
            for optimizer_set in optimizer_sets:
                m = len(optimizer_set)
                yield (
                    optimizer_set,
                    compressor_set_of,
                    [reduced(optimizer_set, compressor_set_of, c) for c in (1.0, 1 / m, 0.5 / m)],
                )
