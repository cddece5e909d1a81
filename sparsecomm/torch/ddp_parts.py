"""The parts of one DDP bucket's exchange (sparsecomm.torch.ddp), one per kind of collective,
each a BucketPart: the phases of sparsecomm.core.exchange.Exchange over many tensors at once.

all_gather and all_to_all want equal sizes on every rank, and a method's count may differ per
rank: each parameter's rows travel padded to its capacity (Method.most_selected), after a
header of every parameter's count, so no size exchange comes first. The spardl route's part,
Scattered, is in sparsecomm.torch.ddp_spardl.
"""

import abc
import functools
import itertools

import torch

from ..core import wire
from . import collectives, ops
from .exchange import Dense, ints_on
from .sampled_packs import Fixed

COUNT = torch.empty(0, dtype=torch.int64).element_size()


def future_on(device):
    """A future whose value lives on `device`: on a GPU, whoever waits for it waits for the
    kernels that wrote it (CUDA events), not only for the host."""
    return torch.futures.Future(devices=[device] if device.type == "cuda" else None)


def _header(counts, device):
    """The int64 counts on `device`, as bytes."""
    return ints_on(counts, torch.int64, device).view(torch.uint8)


def aligned(nbytes):
    """A region's bytes rounded up to whole counts, so the next header stays 8-byte aligned."""
    return -(-nbytes // COUNT) * COUNT


class BucketPart(abc.ABC):
    """One kind of collective of a bucket's exchange, for all the bucket's gradients it is given."""

    @abc.abstractmethod
    def add(self, grad, *payload) -> tuple:
        """Takes a gradient (a view into the bucket) and what its route sends; returns this rank's
        traffic of it (sent elements, sent bytes, received bytes)."""

    @abc.abstractmethod
    def start(self) -> list:
        """Starts the part's collectives: their futures (none without gradients)."""

    def advance(self) -> None:
        """Starts the later phase, where the part has one (started by the next bucket's hook)."""
        return None

    @abc.abstractmethod
    def finish(self) -> None:
        """Writes the averaged gradients into the bucket, once the futures completed."""


class Reduced(BucketPart):
    """The dense and shared routes: their payloads summed in one all_reduce per dtype."""

    def __init__(self, ways):
        self.ways, self.ranks = ways, ways.size()  # (read once a bucket: a process group's size is a call)
        self.items = []  # (gradient view, payload, Packed of the shared route or None)
        self.works = []  # (dtype, flat sums)

    def add(self, grad, payload, packed=None):
        """A dense payload, or the shared route's values (`packed`: where they belong)."""
        self.items.append((grad, payload, packed))
        return Dense.traffic(payload, self.ranks)

    def start(self):
        import torch.distributed as dist

        futures = []
        for dtype in sorted({p.dtype for _, p, _ in self.items}, key=str):
            flat = torch.cat([p.reshape(-1) for _, p, _ in self.items if p.dtype == dtype])
            futures.append(dist.all_reduce(flat, group=self.ways.group, async_op=True).get_future())
            self.works.append((dtype, flat))
        return futures

    def finish(self):
        for dtype, flat in self.works:
            flat.div_(self.ranks)  # the average, in one op for every payload of the dtype
            items = [item for item in self.items if item[1].dtype == dtype]
            averages = flat.split([payload.numel() for _, payload, _ in items])
            dense = [(grad.view(-1), mean) for (grad, _, packed), mean in zip(items, averages) if packed is None]
            if dense:
                torch._foreach_copy_(*zip(*dense))
            for (grad, _, packed), mean in zip(items, averages):
                if packed is not None and packed.start is not None:
                    ops.block_unpack(mean, grad.numel(), packed.start, out=grad.view(-1))
                elif packed is not None:
                    ops.sparse_unpack(mean, packed.index, grad.numel(), out=grad.view(-1))


class GatherLayout:
    """Where a bucket's parameters on the allgather route lie in each rank's chunk: after a header of
    their counts, each one's region of its capacity's bytes, in order. Worked out once per routes
    (kept on the Bucket while they stand), from one step's Packeds: which are rows at fixed capacity
    (their counts written by the op), rows whose counts the host knows, or 1-/2-bit segments at fixed
    capacity (a bucket's 1-/2-bit packs are made so: SampledPacks)."""

    def __init__(self, names, numels, capacities, packeds, ranks):
        self.names, self.numels, n = names, numels, len(names)
        self.kinds, self.sizes, self.rooms = [], [], []  # each parameter's kind, region bytes and pack's room
        for numel, capacity, packed in zip(numels, capacities, packeds):
            fixed = packed.fixed
            if packed.bits is not None:  # (laid out for the pack's room, in a region of the capacity's)
                self.kinds.append(("segments", packed.bits))
                self.sizes.append(_segment_bytes(capacity, packed.bits, numel))
                self.rooms.append(fixed.index.numel())
                continue
            values = fixed.values if fixed is not None else packed.values
            self.kinds.append(("fixed" if fixed is not None else "known", values.dtype))
            self.sizes.append(_region_bytes(capacity, values.element_size(), numel))
            self.rooms.append(None)
        self.regions = list(zip(itertools.accumulate([COUNT * n, *self.sizes[:-1]]), self.sizes))
        self.chunk = COUNT * n + sum(self.sizes)
        self.groups = {}  # kind -> the positions of that kind, each kind written (and read) by one op
        for i, kind in enumerate(self.kinds):
            self.groups.setdefault(kind, []).append(i)
        # what travels a step, padding included: every region and its count, sent and received
        self.traffic = [(size + COUNT, (ranks - 1) * (size + COUNT)) for size in self.sizes]

    def places(self, kind, positions):
        """The places each kind's write op takes: (count slot, byte offset, numel) of fixed rows and
        segments, (byte offset, numel) of rows whose counts the host knows."""
        if kind[0] == "known":
            return [(self.regions[i][0], self.numels[i]) for i in positions]
        return [(COUNT * i, self.regions[i][0], self.numels[i]) for i in positions]

    def reads(self, kind, positions):
        """The places each kind's unpack takes: (count slot, byte offset, bytes) of rows, (byte
        offset, room) of segments."""
        if kind[0] == "segments":
            return [(self.regions[i][0], self.rooms[i]) for i in positions]
        return [(i, *self.regions[i]) for i in positions]


class Gathered(BucketPart):
    """The allgather route: every rank's rows, or 1-/2-bit segment, of each parameter in one
    all_gather, unpacked in rank order and averaged. Each kind (rows of a value dtype, segments) is
    written by one op and unpacked by one, which reads the counts where they lie (on a GPU, no
    wait). Its parameters come together (add_all), in the order of their GatherLayout."""

    def __init__(self, ways, counters):
        self.ways, self.counters = ways, counters
        self.layout, self.grads, self.packeds = None, [], []
        self.everyone = None

    def add(self, grad, name, packed, capacity):
        """One parameter alone: add_all of a layout of one."""
        layout = GatherLayout([name], [grad.numel()], [capacity], [packed], self.ways.size())
        return self.add_all(layout, [grad], [packed])[0]

    def add_all(self, layout, grads, packeds):
        """The bucket's gradients on this route and their Packeds (values or codes, with indices), in
        `layout`'s order. A fixed-capacity one's count stays on the device: its rows' or segment's
        count is written there, and its sent elements are counted there (Counters.account_on_device).
        Returns each one's traffic (sent elements, sent bytes, received bytes)."""
        self.layout, self.grads, self.packeds = layout, grads, packeds
        traffic = [(0, *moved) for moved in layout.traffic]
        for (kind, _), positions in layout.groups.items():
            if kind == "known":
                for i in positions:
                    traffic[i] = (packeds[i].index.numel(), *layout.traffic[i])
        return traffic

    def start(self):
        layout = self.layout
        if layout is None:
            return []
        device = self.grads[0].device
        mine = torch.zeros(layout.chunk, dtype=torch.uint8, device=device)
        known = [i for (kind, _), positions in layout.groups.items() if kind == "known" for i in positions]
        if known:  # (their rows' counts, from the host, before the ops write the others' on the device)
            header = [0] * len(layout.names)
            for i in known:
                header[i] = self.packeds[i].index.numel() + wire.buckets(0, layout.numels[i])
            mine[: COUNT * len(header)] = _header(header, device)
        for kind, positions in layout.groups.items():
            self._write(mine, layout, kind, positions)
        self.everyone = torch.empty(self.ways.size() * layout.chunk, dtype=torch.uint8, device=device)
        work = collectives.all_gather_into(self.everyone, mine, self.ways.group, async_op=True)
        return [work.get_future()]

    def _write(self, mine, layout, kind, positions):
        """One kind's rows or segments into this rank's chunk, by one op."""
        places = layout.places(kind, positions)
        if kind[0] == "known":
            packeds = [self.packeds[i] for i in positions]
            sizes = [
                wire.rows_bytes(p.index.numel(), p.values.element_size(), 0, n) for p, (_, n) in zip(packeds, places)
            ]
            _check_rooms(layout, positions, sizes)
            ops.wire_rows_many_into([p.values for p in packeds], [p.index for p in packeds], places, out=mine)
            return
        fixed = Fixed.lists_of([self.packeds[i].fixed for i in positions])
        if kind[0] == "fixed":
            ops.wire_rows_fixed_into(*fixed, places, out=mine)
        else:
            ops.quantized_segments_fixed_into(*fixed, kind[1], places, out=mine)
        self.counters.account_on_device([layout.names[i] for i in positions], fixed[-1])

    def finish(self):
        layout = self.layout
        if layout is None:
            return
        ranks = self.ways.size()
        everyone = self.everyone.view(ranks, -1)
        for kind, positions in layout.groups.items():
            outs = [self.grads[i] for i in positions]  # (contiguous views: the ops read their elements, not shape)
            reads = layout.reads(kind, positions)
            if kind[0] == "segments":
                ops.sparse_unpack_gathered_segments(everyone, reads, kind[1], 1.0, ranks, outs=outs)
            else:
                ops.sparse_unpack_gathered_rows(everyone, reads, kind[1], 1.0, ranks, outs=outs)


def _check_rooms(layout, positions, nbytes):
    """Refuses a send past its region (a capacity too small: a bug, never the user's)."""
    for i, size in zip(positions, nbytes):
        if size > layout.regions[i][1]:
            raise RuntimeError(
                f"sparsecomm ddp_hook: {size} bytes of {layout.names[i]!r} exceed its capacity "
                f"({layout.regions[i][1]} bytes)"
            )


@functools.lru_cache(maxsize=4096)
def _region_bytes(capacity, value_bytes, numel):
    """The bytes of a region of rows of `capacity` elements, aligned: a function of the parameter's
    shape and density, computed once, not per step."""
    return aligned(wire.rows_bytes(capacity, value_bytes, 0, numel))


@functools.lru_cache(maxsize=4096)
def _segment_bytes(room, bits, numel):
    """The bytes of a 1-/2-bit segment laid out for `room` elements (a multiple of 8, as a region's):
    a function of the parameter's shape and density, computed once, not per step."""
    return wire.Segment(room, wire.scale_count(bits), bits, numel).size
