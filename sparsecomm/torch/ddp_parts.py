"""The parts of one DDP bucket's exchange (sparsecomm.torch.ddp), one per kind of collective,
each a BucketPart: the phases of sparsecomm.core.exchange.Exchange over many tensors at once.

all_gather and all_to_all want equal sizes on every rank, and a method's count may differ per
rank: each parameter's rows travel padded to its capacity (Method.most_selected), after a
header of every parameter's count, so no size exchange comes first. The spardl route's part,
Scattered, is in sparsecomm.torch.ddp_spardl.
"""

import abc
import dataclasses
import functools

import torch

from ..core import wire
from . import collectives, ops
from .exchange import Dense, ints_on

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


@dataclasses.dataclass
class Send:
    """A send whose wire rows are still to be written: its values, int32 indices, the tensor's
    numel and the rows' bytes (at most). At fixed capacity, `count` (a 1-element int64 tensor on
    the device) says how many of values it sends."""

    values: torch.Tensor
    index: torch.Tensor
    length: int
    nbytes: int
    count: torch.Tensor | None = None


@dataclasses.dataclass
class Quantized:
    """A 1-/2-bit pack at fixed capacity whose segment is still to be written: its codes, scales and
    int32 indices (room of them), its count (a 1-element int64 tensor on the device), the tensor's
    numel, the bits and the segment's bytes (laid out for the room, whatever the count)."""

    codes: torch.Tensor
    scales: torch.Tensor
    index: torch.Tensor
    count: torch.Tensor
    numel: int
    bits: int
    nbytes: int


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


class Gathered(BucketPart):
    """The allgather route: every rank's rows, or 1-/2-bit segment, of each parameter in one
    all_gather, unpacked in rank order and averaged. The rows of all the parameters are unpacked by
    one op, their segments by another, each reading the counts where they lie (on a GPU, no wait)."""

    def __init__(self, ways, counters):
        self.ways, self.counters = ways, counters
        self.items = []  # (gradient view, name, count, capacity in bytes, reader)
        self.blobs = []  # this rank's bytes of each parameter
        self.everyone = None

    def add(self, grad, name, packed, capacity):
        """A parameter's Packed (values or codes, with indices), at most `capacity` elements. A
        fixed-capacity one's count stays on the device: its rows' count is written there, and its
        sent elements are counted there (Counters.account_on_device)."""
        if packed.bits is None:  # its rows are written at start, straight into the chunk
            fixed = packed.fixed
            values, index, count = fixed if fixed is not None else (packed.values, packed.index, None)
            numel, value_bytes, room = grad.numel(), values.element_size(), index.numel()
            send_bytes, capacity_bytes = _rows_bytes(room, capacity, value_bytes, numel)
            send = Send(values, index, numel, send_bytes, count)
            reader = ("rows", values.dtype, wire.row_bytes(value_bytes))
            rows = 0 if fixed is not None else room + wire.buckets(0, numel)  # (fixed: written by the op)
            _, sent, received = self._add(grad, name, rows, send, capacity_bytes, reader)
            return (0 if fixed is not None else room), sent, received  # elements, not rows
        codes, scales, index, count = packed.fixed  # (a bucket's 1-/2-bit packs are made at fixed capacity)
        numel, room, bits = grad.numel(), index.numel(), packed.bits
        send = Quantized(codes, scales, index, count, numel, bits, _segment_bytes(room, bits, numel))
        return self._add(grad, name, 0, send, _segment_bytes(capacity, bits, numel), ("segments", bits, room))

    def _add(self, grad, name, count, blob, capacity_bytes, reader):
        """`blob`: a Send whose rows, or a Quantized whose segment, are written into the chunk at start."""
        if blob.nbytes > capacity_bytes:
            raise RuntimeError(
                f"sparsecomm ddp_hook: {count} elements of {name!r} ({blob.nbytes} bytes) exceed its "
                f"capacity ({capacity_bytes} bytes)"
            )
        self.items.append((grad, name, count, capacity_bytes, reader))
        self.blobs.append(blob)
        return count, capacity_bytes + COUNT, 0  # what travels, padding included

    def start(self):
        if not self.items:
            return []
        device = self.items[0][0].device
        offset = COUNT * len(self.items)
        mine = torch.zeros(offset + sum(c for *_, c, _ in self.items), dtype=torch.uint8, device=device)
        mine[:offset] = _header([count for _, _, count, _, _ in self.items], device)
        sends, segments = [], []  # (Send or Quantized, its byte offset, its item): each kind by one op
        for i, (blob, (*_, capacity, _)) in enumerate(zip(self.blobs, self.items)):
            (sends if isinstance(blob, Send) else segments).append((blob, offset, i))
            offset += capacity
        self._write_rows(mine, sends)
        self._write_segments(mine, segments)
        ranks = self.ways.size()
        self.everyone = torch.empty(ranks * mine.numel(), dtype=torch.uint8, device=device)
        work = collectives.all_gather_into(self.everyone, mine, self.ways.group, async_op=True)
        return [work.get_future()]

    def _write_rows(self, mine, sends):
        """The sends' rows into this rank's chunk, by one op for those whose counts the host knows
        and one for those of fixed capacity (their counts and rows' counts stay on the device)."""
        known = [(s, at) for s, at, _ in sends if s.count is None]
        if known:
            values, indices = [s.values for s, _ in known], [s.index for s, _ in known]
            ops.wire_rows_many_into(values, indices, [(at, s.length) for s, at in known], out=mine)
        fixed = [(s, at, i) for s, at, i in sends if s.count is not None]
        if fixed:
            values, indices = [s.values for s, _, _ in fixed], [s.index for s, _, _ in fixed]
            counts = torch.cat([s.count for s, _, _ in fixed])
            places = [(COUNT * i, at, s.length) for s, at, i in fixed]
            ops.wire_rows_fixed_into(values, indices, counts, places, out=mine)
            self.counters.account_on_device([self.items[i][1] for _, _, i in fixed], counts)

    def _write_segments(self, mine, segments):
        """The 1-/2-bit packs' fixed segments into this rank's chunk, by one op (their counts, and the
        header's copies of them, written on the device)."""
        for bits in {s.bits for s, _, _ in segments}:  # (one: a compressor's)
            chosen = [(s, at, i) for s, at, i in segments if s.bits == bits]
            codes, scales, indices = ([getattr(s, part) for s, _, _ in chosen] for part in ("codes", "scales", "index"))
            counts = torch.cat([s.count for s, _, _ in chosen])
            places = [(COUNT * i, at, s.numel) for s, at, i in chosen]
            ops.quantized_segments_fixed_into(codes, scales, indices, counts, bits, places, out=mine)
            self.counters.account_on_device([self.items[i][1] for _, _, i in chosen], counts)

    def finish(self):
        if not self.items:
            return
        ranks, offset, regions = self.ways.size(), COUNT * len(self.items), []
        for _, name, _, capacity, _ in self.items:
            regions.append((offset, capacity))
            offset += capacity
            self.counters.account_later(name, 0, (ranks - 1) * (capacity + COUNT))
        everyone = self.everyone.view(ranks, -1)
        kinds = {}  # (kind, value dtype or bits): the items unpacked together, counts read where they lie
        for i, (*_, reader) in enumerate(self.items):
            kinds.setdefault(reader[:2], []).append(i)
        for (kind, of), chosen in kinds.items():
            outs = [self.items[i][0].view(-1) for i in chosen]
            if kind == "rows":
                ops.sparse_unpack_gathered_rows(everyone, [(i, *regions[i]) for i in chosen], of, 1.0, ranks, outs=outs)
            else:  # (each segment laid out for its room: reader[2])
                places = [(regions[i][0], self.items[i][4][2]) for i in chosen]
                ops.sparse_unpack_gathered_segments(everyone, places, of, 1.0, ranks, outs=outs)


@functools.lru_cache(maxsize=4096)
def _rows_bytes(room, capacity, value_bytes, numel):
    """The bytes of a send's rows with `room` elements, and of its region (`capacity`'s, aligned):
    a function of the parameter's shape and density, computed once, not per step."""
    return wire.rows_bytes(room, value_bytes, 0, numel), aligned(wire.rows_bytes(capacity, value_bytes, 0, numel))


@functools.lru_cache(maxsize=4096)
def _segment_bytes(room, bits, numel):
    """The bytes of a 1-/2-bit segment laid out for `room` elements (a multiple of 8, as a region's):
    a function of the parameter's shape and density, computed once, not per step."""
    return wire.Segment(room, wire.scale_count(bits), bits, numel).size
