"""The DDP hook's spardl route (sparsecomm.torch.ddp): SparDL over a bucket's tensors, at fixed
capacity (spardl_fixed makes the choices, exchange.spardl_blocks and owner_keeps' rules), so that
on a GPU the host reads nothing.

    start     each block's rows to its owner: one all_to_all of every rank's chunks
    advance   (at the next bucket's hook) each owner's sums, in rank order, and its per_rank
              largest: one all_gather of every rank's chunk
    finish    each rank's reduced blocks unpacked into the slices of the gradients it owns

A chunk is a header of each parameter's row count (int64), then each parameter's rows, padded to
layout.most_rows(). The rows are relative to their block (a send of [0, size)): the owner sums
them straight into its block, and a rank's reduced rows unpack into the slice it owns.
"""

import functools

import torch

from ..core import wire
from ..core.plan import SparDLLayout
from . import collectives, ops, spardl_fixed
from .ddp_parts import COUNT, BucketPart, aligned, future_on
from .exchange import ints_on


def _width(value_dtype):
    """The bytes of a wire row with values of `value_dtype`."""
    return wire.row_bytes(torch.finfo(value_dtype).bits // 8)  # (no tensor made: this runs per parameter)


def _share_bytes(layout, width):
    """A parameter's region in a chunk: its most rows (SparDLLayout.most_rows), aligned."""
    return aligned(layout.most_rows() * width)


def _chunk(regions, first=None):
    """A chunk of a header of counts, then the regions (from byte `first`, default right after
    the header): (each region's byte offset, the chunk's bytes, aligned)."""
    at = COUNT * len(regions) if first is None else first
    return [at + offset for offset in spardl_fixed.offsets_of(regions)], aligned(at + sum(regions))


class Scattered(BucketPart):
    """The spardl route's two collectives for a bucket's parameters (the module's docstring)."""

    def __init__(self, ways, counters):
        self.ways, self.counters, self.rank = ways, counters, ways.rank()
        self.wires, self.layouts, self.selections = [], [], []
        self.done = None  # the second phase's arrival, on the rows' device

    def add(self, wire_, packed):
        layout = SparDLLayout.of(wire_.shape.numel(), wire_.k, wire_.ranks)
        selection = tuple(packed.fixed) if packed.fixed is not None else (packed.values, packed.index, None)
        self.wires.append(wire_)
        self.layouts.append(layout)
        self.selections.append(selection)
        padded = (wire_.ranks - 1) * (COUNT + _share_bytes(layout, _width(selection[0].dtype)))
        return 0, padded, padded  # (the sent elements are counted on the device, at start)

    def start(self):
        if not self.wires:
            return []
        import torch.distributed as dist

        dtypes = {values.dtype for values, _, _ in self.selections}
        if len(dtypes) > 1:
            raise RuntimeError(f"sparsecomm ddp_hook: a bucket's spardl values should share a dtype, got {dtypes}")
        self.value_dtype, ranks = dtypes.pop(), self.ways.size()
        residuals = [wire_.residual for wire_ in self.wires]
        self.split = spardl_fixed.split(self.selections, self.layouts, self.rank, residuals)
        self.shares = [_share_bytes(layout, _width(self.value_dtype)) for layout in self.layouts]
        self.offsets, chunk = _chunk(self.shares)
        sending = torch.zeros(ranks, chunk, dtype=torch.uint8, device=self.split.counts.device)
        others = [b for b in range(ranks) if b != self.rank]
        rooms = [layout.per_rank for layout in self.layouts for _ in range(ranks)]  # (each owner's, in turn)
        values, index = (spardl_fixed.parts_of(t, rooms) for t in (self.split.send_values, self.split.send_index))
        sends = []  # (values, index, place) of every parameter's send to every other owner
        for p, layout in enumerate(self.layouts):
            for owner in others:
                size = layout.owned(owner)[1]
                place = (owner * chunk + COUNT * p, owner * chunk + self.offsets[p], size)
                v, i = values[p * ranks + owner], index[p * ranks + owner]
                sends.append((v, i, place) if size >= layout.per_rank else (v[:size], i[:size], place))
        _write_rows(sends, self.split.counts[:, others].reshape(-1), sending)
        self.counters.account_on_device([wire_.name for wire_ in self.wires], self.split.counts.sum(1))
        self.received, self.done = torch.empty_like(sending), future_on(sending.device)
        self.work = dist.all_to_all_single(self.received, sending, group=self.ways.group, async_op=True)
        self.ways.scattered.append(self)
        return [self.done]

    def advance(self):
        """Waits for the scatter, reduces each owned block (in rank order) and starts the gather."""
        self.work.wait()
        table = OwnerTable(self.received, self.offsets, self.layouts, self.split, self.rank, _width(self.value_dtype))
        sums, sums_at = _owned_sums(self.wires, self.layouts, self.value_dtype, table, self.rank)
        residuals = [wire_.residual for wire_ in self.wires]
        values, index, counts, rooms = spardl_fixed.reduce(
            sums, sums_at, table.arrived(), self.layouts, self.rank, self.value_dtype, residuals
        )
        sizes = [layout.owned(self.rank)[1] for layout in self.layouts]
        sends = []
        for p, (v, i) in enumerate(zip(spardl_fixed.parts_of(values, rooms), spardl_fixed.parts_of(index, rooms))):
            sends.append((v, i, (COUNT * p, self.offsets[p], sizes[p])))
            self.counters.account_later(self.wires[p].name, self.shares[p] + COUNT, 0)
        mine = torch.zeros(self.received.shape[1], dtype=torch.uint8, device=self.received.device)
        _write_rows(sends, counts, mine)
        self.everyone = torch.empty(self.received.numel(), dtype=torch.uint8, device=mine.device)
        work = collectives.all_gather_into(self.everyone, mine, self.ways.group, async_op=True)
        work.get_future().add_done_callback(self._arrived)

    def _arrived(self, gathered):
        try:
            gathered.wait()  # (on a GPU: this stream waits for the gather, then records for `done`)
            self.done.set_result(gathered.value())
        except Exception as error:  # the gather's error, raised by the bucket's finish
            self.done.set_exception(error)

    def finish(self):
        """Each rank's reduced blocks, unpacked into the slices of the gradients it owns, averaged."""
        if not self.wires:
            return
        ranks = self.ways.size()
        everyone = self.everyone.view(ranks, -1)
        for wire_, share in zip(self.wires, self.shares):
            self.counters.account_later(wire_.name, 0, (ranks - 1) * (share + COUNT))
        for owner in range(ranks):
            chosen = [p for p, layout in enumerate(self.layouts) if layout.owned(owner)[1]]
            outs = [self.wires[p].output()[_span(self.layouts[p], owner)] for p in chosen]
            regions = [(p, self.offsets[p], self.shares[p]) for p in chosen]
            one = everyone[owner : owner + 1]
            ops.sparse_unpack_gathered_rows(one, regions, self.value_dtype, 1.0, ranks, outs=outs)


def _span(layout, owner):
    low, size = layout.owned(owner)
    return slice(low, low + size)


class OwnerTable:
    """What arrived at an owner, with its own rows in its rank's row: each parameter's region
    widened to hold its block's selection too, and starting on a whole row, so that one view
    holds every row of every region."""

    def __init__(self, received, offsets, layouts, split, rank, width):
        """received: the all_to_all's chunks, each parameter's region at offsets[p]; split: this
        rank's spardl_fixed.Split, whose own rows go into the table."""
        self.layouts, self.rank, self.width, n = layouts, rank, width, len(layouts)
        self.rows = [
            max(layout.most_rows(), room + wire.buckets(0, layout.owned(rank)[1]))
            for layout, room in zip(layouts, split.own_rooms)
        ]
        self.row_at, self.first = spardl_fixed.offsets_of(self.rows), -(-COUNT * n // width) * width
        at, chunk = _chunk([rows * width for rows in self.rows], self.first)
        self.regions = [(p, a, rows * width) for p, (a, rows) in enumerate(zip(at, self.rows))]
        self.table = torch.empty(received.shape[0], chunk, dtype=torch.uint8, device=received.device)
        self.table[:, : COUNT * n] = received[:, : COUNT * n]
        _copy_regions(received, self.table, tuple(zip(offsets, at, [m.most_rows() * width for m in layouts])))
        values, index = (spardl_fixed.parts_of(t, split.own_rooms) for t in (split.own_values, split.own_index))
        sends = []
        for p, layout in enumerate(layouts):
            place = (rank * chunk + COUNT * p, rank * chunk + at[p], layout.owned(rank)[1])
            sends.append((values[p], index[p], place))
        _write_rows(sends, split.own_counts, self.table)

    def arrived(self):
        """Every region's rows, as spardl_fixed.reduce takes them."""
        n, total = len(self.layouts), sum(self.rows)
        rows = self.table[:, self.first : self.first + total * self.width].view(self.table.shape[0], total, self.width)
        return spardl_fixed.Arrived(rows, self.table[:, : COUNT * n].view(torch.int64), self.row_at, self.rows)


def _copy_regions(source, target, regions):
    """Each region (from, to, bytes) of every row of `source` copied into `target`: by one gather
    where a copy is a launch (cached byte indices), region by region on a CPU (memcpy's speed)."""
    if ops.reads_wait(source.device):
        take, put = _moves(regions, source.device)
        target[:, put] = source[:, take]
        return
    for at, to, size in regions:
        target[:, to : to + size] = source[:, at : at + size]


@functools.lru_cache(maxsize=64)
def _moves(regions, device):
    """Byte indices on `device` that copy regions (from, to, bytes) of one chunk into another
    (cached: a bucket's layout is the same every step)."""
    source = [at + i for at, _, size in regions for i in range(size)]
    target = [at + i for _, at, size in regions for i in range(size)]
    return ints_on(source, torch.int64, device), ints_on(target, torch.int64, device)


def _write_rows(sends, counts, out):
    """Fixed-capacity sends, (values, index, (count slot, byte offset, length)), the first
    counts[i] of each, written into `out` by one op: their rows and, in the slot, their number."""
    if sends:
        values, indices, places = zip(*sends)
        ops.wire_rows_fixed_into(list(values), list(indices), counts, list(places), out=out.view(-1))


def _owned_sums(wires, layouts, value_dtype, table, rank):
    """The float32 sums of each parameter's owned block, in rank order, by one op: in the front of
    its gradient's buffer when the gradients are float32 views of one buffer (a DDP bucket's; a new
    buffer otherwise). Returns (a flat tensor holding them all, each one's offset in it)."""
    sizes = [layout.owned(rank)[1] for layout in layouts]
    storage = wires[0].out.untyped_storage()
    if all(w.dtype == torch.float32 and w.out.untyped_storage().data_ptr() == storage.data_ptr() for w in wires):
        flat = torch.empty(0, dtype=torch.float32, device=table.table.device).set_(storage)
        sums = [wire_.output()[:size] for wire_, size in zip(wires, sizes)]
        at = [s.storage_offset() for s in sums]
    else:
        flat = torch.empty(sum(sizes), dtype=torch.float32, device=table.table.device)
        sums, at = list(flat.split(sizes)), spardl_fixed.offsets_of(sizes)
    ops.sparse_unpack_gathered_rows(table.table, table.regions, value_dtype, 1.0, 1, outs=sums)
    return flat, at
