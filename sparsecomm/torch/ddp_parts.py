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


def _counts(table, params):
    """Each rank's row of `table` (uint8) starts with the header of `params` counts: them, per
    rank, read on the host (on a GPU: one read per table)."""
    return table[:, : COUNT * params].contiguous().view(torch.int64).tolist()


def aligned(nbytes):
    """A region's bytes rounded up to whole counts, so the next header stays 8-byte aligned."""
    return -(-nbytes // COUNT) * COUNT


def _bytes(tensor):
    return tensor.contiguous().view(-1).view(torch.uint8)


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
    (kept on the Bucket while they stand), from one step's Packeds: which are at fixed capacity (their
    counts written by the op), which have counts the host knows, which are 1-/2-bit segments."""

    def __init__(self, names, numels, capacities, packeds, ranks):
        self.names, self.numels, n = names, numels, len(names)
        self.readers, self.kinds, self.sizes = [], [], []  # each parameter's reader, kind and region bytes
        for numel, capacity, packed in zip(numels, capacities, packeds):
            if packed.bits is not None:
                segment = wire.Segment(capacity, wire.scale_count(packed.bits), packed.bits, numel)
                self.kinds.append("segments")
                self.readers.append(("segments", packed.bits, numel))
                self.sizes.append(segment.size)
                continue
            values = packed.fixed.values if packed.fixed is not None else packed.values
            self.kinds.append("fixed" if packed.fixed is not None else "known")
            self.readers.append(("rows", values.dtype, wire.row_bytes(values.element_size())))
            self.sizes.append(_rows_bytes(0, capacity, values.element_size(), numel)[1])
        self.regions = list(zip(itertools.accumulate([COUNT * n, *self.sizes[:-1]]), self.sizes))
        self.chunk = COUNT * n + sum(self.sizes)
        self.fixed = [i for i, kind in enumerate(self.kinds) if kind == "fixed"]
        self.fixed_places = [(COUNT * i, self.regions[i][0], numels[i]) for i in self.fixed]
        self.fixed_names = [names[i] for i in self.fixed]
        self.known = [i for i, kind in enumerate(self.kinds) if kind == "known"]
        self.segments = [i for i, kind in enumerate(self.kinds) if kind == "segments"]
        self.rows = {}  # value dtype -> (the positions whose rows one unpack reads, their (slot, offset, bytes))
        for i, reader in enumerate(self.readers):
            if reader[0] == "rows":
                positions, places = self.rows.setdefault(reader[1], ([], []))
                positions.append(i)
                places.append((i, *self.regions[i]))
        # what travels a step, padding included: every region and its count, sent and received
        self.traffic = [(size + COUNT, (ranks - 1) * (size + COUNT)) for size in self.sizes]


class Gathered(BucketPart):
    """The allgather route: every rank's rows, or 1-/2-bit segment, of each parameter in one
    all_gather, unpacked in rank order and averaged. The rows of all the parameters are unpacked by
    one op, which reads the counts where they lie (on a GPU, no wait). Its parameters come together
    (add_all), in the order of their GatherLayout."""

    def __init__(self, ways, counters):
        self.ways, self.counters = ways, counters
        self.layout, self.grads, self.packeds = None, [], []
        self.everyone = None

    def add(self, grad, name, packed, capacity):
        """One parameter alone (see add_all)."""
        layout = GatherLayout([name], [grad.numel()], [capacity], [packed], self.ways.size())
        return self.add_all(layout, [grad], [packed])[0]

    def add_all(self, layout, grads, packeds):
        """The bucket's gradients on this route and their Packeds (values or codes, with indices), in
        `layout`'s order. A fixed-capacity one's count stays on the device: its rows' count is written
        there, and its sent elements are counted there (Counters.account_on_device). Returns each
        one's traffic (sent elements, sent bytes, received bytes)."""
        self.layout, self.grads, self.packeds = layout, grads, packeds
        traffic = [(0, *moved) for moved in layout.traffic]
        for i in layout.known:
            traffic[i] = (packeds[i].index.numel(), *layout.traffic[i])
        for i in layout.segments:
            traffic[i] = (packeds[i].index.numel(), *layout.traffic[i])
        return traffic

    def start(self):
        layout = self.layout
        if layout is None:
            return []
        device = self.grads[0].device
        mine = torch.zeros(layout.chunk, dtype=torch.uint8, device=device)
        if layout.fixed:
            values, indices, counts = Fixed.lists_of([self.packeds[i].fixed for i in layout.fixed])
            ops.wire_rows_fixed_into(values, indices, counts, layout.fixed_places, out=mine)
            self.counters.account_on_device(layout.fixed_names, counts)
        if layout.known or layout.segments:
            self._write_counted(mine, layout)
        self.everyone = torch.empty(self.ways.size() * layout.chunk, dtype=torch.uint8, device=device)
        work = collectives.all_gather_into(self.everyone, mine, self.ways.group, async_op=True)
        return [work.get_future()]

    def _write_counted(self, mine, layout):
        """The rows and segments whose counts the host knows, with their counts in the header."""
        header = [0] * len(layout.names)
        for i in layout.known:
            header[i] = self.packeds[i].index.numel() + wire.buckets(0, layout.numels[i])
        for i in layout.segments:
            header[i] = self.packeds[i].index.numel()
        mine[: COUNT * len(header)] = _header(header, mine.device)
        if layout.known:
            packeds = [self.packeds[i] for i in layout.known]
            places = [(layout.regions[i][0], layout.numels[i]) for i in layout.known]
            _check_rooms(
                layout,
                layout.known,
                [wire.rows_bytes(p.index.numel(), p.values.element_size(), 0, n) for p, (_, n) in zip(packeds, places)],
            )
            ops.wire_rows_many_into([p.values for p in packeds], [p.index for p in packeds], places, out=mine)
        for i in layout.segments:
            packed, at = self.packeds[i], layout.regions[i][0]
            blob = ops.quantized_segment(packed.codes, packed.scales, packed.index, packed.bits, layout.numels[i])
            _check_rooms(layout, [i], [blob.nbytes])
            mine[at : at + blob.nbytes].copy_(blob)

    def finish(self):
        layout = self.layout
        if layout is None:
            return
        ranks = self.ways.size()
        everyone = self.everyone.view(ranks, -1)
        for value_dtype, (positions, places) in layout.rows.items():
            outs = [self.grads[i] for i in positions]  # (contiguous views: the op reads their elements, not shape)
            ops.sparse_unpack_gathered_rows(everyone, places, value_dtype, 1.0, ranks, outs=outs)
        counts = _counts(everyone, len(layout.names)) if layout.segments else None
        for i in layout.segments:
            grad, (start, _), reader = self.grads[i], layout.regions[i], layout.readers[i]
            blobs = [everyone[r, start : start + _segment_bytes(reader, counts[r][i])] for r in range(ranks)]
            ops.sparse_unpack_segments(torch.cat(blobs), reader[1], ranks, grad.numel(), 1.0, ranks, out=grad.view(-1))


def _check_rooms(layout, positions, nbytes):
    """Refuses a send past its region (a capacity too small: a bug, never the user's)."""
    for i, size in zip(positions, nbytes):
        if size > layout.regions[i][1]:
            raise RuntimeError(
                f"sparsecomm ddp_hook: {size} bytes of {layout.names[i]!r} exceed its capacity "
                f"({layout.regions[i][1]} bytes)"
            )


@functools.lru_cache(maxsize=4096)
def _rows_bytes(room, capacity, value_bytes, numel):
    """The bytes of a send's rows with `room` elements, and of its region (`capacity`'s, aligned):
    a function of the parameter's shape and density, computed once, not per step."""
    return wire.rows_bytes(room, value_bytes, 0, numel), aligned(wire.rows_bytes(capacity, value_bytes, 0, numel))


def _segment_bytes(reader, count):
    """The bytes a rank's 1-/2-bit segment of `count` elements takes, of its padded region."""
    bits, numel = reader[1:]
    return wire.Segment(count, wire.scale_count(bits), bits, numel).size
