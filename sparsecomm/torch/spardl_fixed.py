"""SparDL's two choices (exchange.spardl_blocks and owner_keeps) for a bucket of tensors at once,
at fixed capacity: what the DDP hook's spardl route runs. Every size is known from the layouts: a
send to an owner has room for per_rank elements, an owned block's reduced rows too, and the
counts are tensors, so the wire's sizes never wait for the data.

Where a host read waits for a device (CUDA, and the emulated CUDA binding that stands in for it),
the choices are made there, by a fixed number of ops for the whole bucket, and the host reads
nothing: per block the per_rank largest |value| (NaN as +inf, -0 as 0, ties to the lower index),
in index order, by sorting keys of (tensor and owner, magnitude); instead of dropping entries the
ops mask them (a masked entry adds -0.0 to a residual, which changes no value). Each tensor's
residual takes one op a phase: they are separate tensors. On a CPU, where a read costs nothing,
the host-sized functions make the same choices tensor by tensor, in less time where the tensors
select many elements each; where they select few, the device's way, whose ops are per bucket,
is faster there too (docs/kernels.md). tests/compressors/test_spardl_fixed.py checks that both
give the same bits.
"""

import itertools
from dataclasses import dataclass

import torch

from ..core import wire as wire_format
from . import ops
from .exchange import layout_ints_on, owner_keeps, spardl_blocks, to_value_dtype

_LOW = 0x7FFFFFFF  # a non-negative float32's bits are at most this (+inf, NaN's stand-in, is less)
# On a CPU, the device's way below this many sent rows a tensor (about k): its sorts over the
# bucket cost less than the host-sized functions' ops per tensor there (docs/kernels.md).
FEW_ROWS = 96


@dataclass
class Split:
    """Phase 1 of n tensors. Tensor t's send to owner b: send_values/send_index (int32, relative to
    the block) at send_at[t] + b * per_rank, its first counts[t, b] (int64 [n, ranks], own 0). Its
    own block's elements: own_values/own_index at own_at[t], room own_rooms[t], own_counts[t]."""

    send_values: torch.Tensor
    send_index: torch.Tensor
    counts: torch.Tensor
    send_at: list
    own_values: torch.Tensor
    own_index: torch.Tensor
    own_counts: torch.Tensor
    own_at: list
    own_rooms: list


@dataclass
class Arrived:
    """The rows an owner has for phase 2: rows, uint8 [senders, rows, width], tensor t's region
    of each sender rows[:, row_at[t] : row_at[t] + room[t]] (the regions one after the other,
    filling the rows), the first counts[s, t] of them sent (int64 [senders, n] on the device,
    markers included; sparsecomm.core.wire's rows, relative to the block)."""

    rows: torch.Tensor
    counts: torch.Tensor
    row_at: list
    room: list


def magnitudes(values):
    """select_top's order: |value| in float32, a NaN as +inf (abs makes -0 a 0)."""
    magnitude = values.float().abs()
    return torch.where(magnitude.isnan(), torch.inf, magnitude)


def places(group, magnitude):
    """Each entry's place in its group (int64 >= 0), largest magnitude first, ties to the lower
    position; a magnitude below 0 comes after every other of its group."""
    bits = torch.where(magnitude < 0, -1, magnitude.view(torch.int32).long())
    order = torch.sort(group << 32 | (_LOW - bits), stable=True).indices
    grouped = group[order]
    place = torch.arange(order.numel(), device=order.device) - torch.searchsorted(grouped, grouped)
    return torch.empty_like(place).index_copy_(0, order, place)


def compacted(values, index, chosen, group, rooms, room_at):
    """The chosen entries of each group g moved, in order, to the front of its room (rooms[g] at
    room_at[g], host ints): (values, index) with a last slot for the others, and each group's
    count (int64 [groups])."""
    groups, device = len(rooms), chosen.device
    counts = torch.zeros(groups + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, torch.where(chosen, group, groups), chosen.long())
    before = torch.cumsum(counts, 0) - counts
    total = sum(rooms)
    slot = torch.cumsum(chosen, 0) - 1 - before[group] + layout_ints_on([*room_at, total], torch.int64, device)[group]
    slot = torch.where(chosen, slot, total)
    out_values = values.new_empty(total + 1).index_copy_(0, slot, values)
    return out_values, index.new_zeros(total + 1).index_copy_(0, slot, index), counts[:groups]


def parts_of(tensor, sizes):
    """The front of `tensor` cut into parts of `sizes`, one after the other: views made by one
    split (a slice each costs a call to the dispatcher: a bucket has hundreds)."""
    return tensor[: sum(sizes)].split(sizes)


def offsets_of(sizes):
    """Where each of `sizes` starts, laid one after the other."""
    return list(itertools.accumulate(sizes, initial=0))[:-1]


def _add_to_residuals(residuals, index, added, sizes):
    """Tensor t's part of `added` into residuals[t] at its part of `index`, the parts of `sizes`
    one after the other: one op a tensor (the parts cut by one split, not a slice each)."""
    for residual, at, value in zip(residuals, index.split(sizes), added.split(sizes)):
        if residual is not None:
            residual.index_add_(0, at, value)


def _split_on_device(selections, layouts, rank, residuals):
    """split, for every tensor at once by ops of the whole selection: no count is read."""
    device, ranks, n = selections[0][1].device, layouts[0].ranks, len(selections)
    rooms = [index.numel() for _, index, _ in selections]
    room_at, room_counts = offsets_of(rooms), layout_ints_on(rooms, torch.int64, device)
    counts = torch.cat([c if c is not None else room_counts[t : t + 1] for t, (_, _, c) in enumerate(selections)])
    item = torch.repeat_interleave(torch.arange(n, device=device), room_counts, output_size=sum(rooms))
    valid = (
        torch.arange(item.numel(), device=device) - layout_ints_on(room_at, torch.int64, device)[item] < counts[item]
    )
    index = torch.where(valid, torch.cat([index for _, index, _ in selections]), 0)
    block = layout_ints_on([layout.block for layout in layouts], torch.int64, device)[item]
    owner = torch.where(valid, index // block, ranks)
    relative = (index - owner * block).int()
    raw = torch.cat([values for values, _, _ in selections])
    flat, group = raw.float(), item * (ranks + 1) + owner
    own = valid & (owner == rank)
    per_rank = layout_ints_on([layout.per_rank for layout in layouts], torch.int64, device)[item]
    sent = valid & ~own & (places(group, magnitudes(flat)) < per_rank)
    _add_to_residuals(residuals, index, torch.where(valid & ~own & ~sent, flat, -0.0), rooms)
    rows = [layout.per_rank if b < ranks else 0 for layout in layouts for b in range(ranks + 1)]
    wired = to_value_dtype(flat, raw.dtype)  # (a NaN as the kernels write it)
    send_values, send_index, sent_counts = compacted(wired, relative, sent, group, rows, offsets_of(rows))
    own_rooms = [min(room, layout.owned(rank)[1]) for room, layout in zip(rooms, layouts)]
    own_values, own_index, own_counts = compacted(raw, relative, own, item, own_rooms, offsets_of(own_rooms))
    sends = sent_counts.view(n, ranks + 1)[:, :ranks]
    send_at = offsets_of(rows)[:: ranks + 1]  # (each tensor's first owner's room)
    return Split(
        send_values, send_index, sends, send_at, own_values, own_index, own_counts, offsets_of(own_rooms), own_rooms
    )


def arrived_index(arrived, sizes):
    """The indices of an Arrived's rows decoded on the device, per (row, sender), row-major (each
    tensor's entries together): (index, tensor) int64. A marker, or a row past its count, reads as
    the tensor's block size (sizes[t])."""
    rows, device, n = arrived.rows, arrived.rows.device, len(arrived.room)
    row_item = torch.repeat_interleave(
        torch.arange(n, device=device), layout_ints_on(arrived.room, torch.int64, device), output_size=rows.shape[1]
    )
    halves = rows.view(torch.int16).int() & 0xFFFF  # (uint16 offset, then a marker's bucket number)
    offset, number = halves[..., 0], halves[..., 1]
    marker = offset == wire_format.MARKER
    position = torch.arange(rows.shape[1], device=device)
    last_marker = torch.cummax(torch.where(marker, position, 0), dim=1).values
    index = torch.gather(number, 1, last_marker).long() * wire_format.BUCKET + offset
    inside = position - layout_ints_on(arrived.row_at, torch.int64, device)[row_item] < arrived.counts[:, row_item]
    index = torch.where(inside & ~marker, index, layout_ints_on(sizes, torch.int64, device)[row_item])
    return index.t().reshape(-1), row_item.repeat_interleave(rows.shape[0])  # (tensor t's: room[t] * senders)


def _reduce_on_device(sums, sums_at, rows, layouts, rank, value_dtype, residuals):
    """reduce, for every tensor at once: the rows decoded (arrived_index), the indices made unique
    by one sort of (tensor, index) keys, the largest sums by a second of (tensor, magnitude) keys.
    No count is read."""
    n, senders = len(layouts), rows.rows.shape[0]
    sizes = [layout.owned(rank)[1] for layout in layouts]
    arrived, item = arrived_index(rows, sizes)
    device = arrived.device
    real = arrived < layout_ints_on(sizes, torch.int64, device)[item]
    key, order = torch.sort(torch.where(real, item << 32 | arrived, n << 32))
    first = (key != torch.cat([key.new_full((1,), -1), key[:-1]])) & (key < n << 32)
    group, at = key >> 32, key & 0xFFFFFFFF
    address = layout_ints_on([*sums_at, 0], torch.int64, device)[group] + at
    reduced = sums[address.clamp(max=max(sums.numel() - 1, 0))] if sums.numel() else at.float()
    per_rank = layout_ints_on([layout.per_rank for layout in layouts] + [0], torch.int64, device)[group]
    kept = first & (places(group, torch.where(first, magnitudes(reduced), -1.0)) < per_rank)
    rounded = to_value_dtype(reduced, value_dtype)
    added = torch.where(first & ~kept, reduced, -0.0)
    if value_dtype != torch.float32:  # a kept sum's rounding error (none for +-inf: it went as is)
        error = reduced - rounded.float()
        added = torch.where(kept, torch.where(error.isfinite(), error, 0.0), added)
    unsorted = torch.empty_like(added).index_copy_(0, order, added)
    lows = layout_ints_on([layout.owned(rank)[0] for layout in layouts], torch.int64, device)
    _add_to_residuals(residuals, torch.where(real, arrived, 0) + lows[item], unsorted, [r * senders for r in rows.room])
    rooms = owner_rooms(layouts, rank)
    values, index, counts = compacted(rounded, at.int(), kept, group, rooms + [0], offsets_of(rooms) + [sum(rooms)])
    return values, index, counts[:n], rooms


def split(selections, layouts, rank, residuals):
    """Phase 1 of n selections (values of one dtype, index int32 ascending, count: a 1-element
    int64 tensor, the entries past it ignored, or None for all), each with its SparDLLayout and
    residual: a Split. What is neither sent nor owned goes to the residual."""
    on = _split_on_device if _by_device(selections[0][1].device, layouts) else _split_on_host
    return on(selections, layouts, rank, residuals)


def reduce(sums, sums_at, rows, layouts, rank, value_dtype, residuals):
    """Phase 2 of n tensors: the owner's float32 sums (tensor t's block at sums_at[t] of `sums`)
    at the indices of the rows that arrived (an Arrived, its own included). Returns (values, int32
    relative indices, counts int64 [n], rooms): tensor t's per_rank largest sums at the front of
    its room, rounded to value_dtype, in index order (the rooms, owner_rooms' sizes, one after the
    other); the rest, and the rounding, to the residuals."""
    on = _reduce_on_device if _by_device(rows.rows.device, layouts) else _reduce_on_host
    return on(sums, sums_at, rows, layouts, rank, value_dtype, residuals)


def owner_rooms(layouts, rank):
    """How many sums `rank` keeps of each tensor at most: per_rank, or its whole block if smaller."""
    return [min(layout.owned(rank)[1], layout.per_rank) for layout in layouts]


def _by_device(device, layouts):
    """Whether the device's way makes the choices: where a read waits, and on a CPU where the
    tensors send few rows each (FEW_ROWS)."""
    rows = sum(layout.ranks * layout.per_rank for layout in layouts)
    return ops.reads_wait(device) or rows <= FEW_ROWS * len(layouts)


def _split_on_host(selections, layouts, rank, residuals):
    """split, tensor by tensor with spardl_blocks (each count read)."""
    ranks, raw = layouts[0].ranks, selections[0][0]
    rows = [layout.ranks * layout.per_rank for layout in layouts]
    own_rooms = [min(index.numel(), layout.owned(rank)[1]) for (_, index, _), layout in zip(selections, layouts)]
    send = raw.new_empty(sum(rows) + 1), torch.zeros(sum(rows) + 1, dtype=torch.int32, device=raw.device)
    own = raw.new_empty(sum(own_rooms) + 1), torch.zeros(sum(own_rooms) + 1, dtype=torch.int32, device=raw.device)
    counts, send_at, own_at = [[0] * ranks for _ in layouts], offsets_of(rows), offsets_of(own_rooms)
    for t, ((values, index, count), layout, residual) in enumerate(zip(selections, layouts, residuals)):
        if count is not None:
            values, index = values[: int(count)], index[: int(count)]
        for b, v, i in spardl_blocks(values, index, layout, rank, residual):
            into, at = (own, own_at[t]) if b == rank else (send, send_at[t] + b * layout.per_rank)
            into[0][at : at + v.numel()] = v
            into[1][at : at + v.numel()] = i - layout.owned(b)[0]
            counts[t][b] = v.numel()
    own_counts = [row[rank] for row in counts]
    sends = torch.tensor([[0 if b == rank else c for b, c in enumerate(row)] for row in counts], device=raw.device)
    own_counted = torch.tensor(own_counts, dtype=torch.int64, device=raw.device)
    return Split(*send, sends, send_at, *own, own_counted, own_at, own_rooms)


def _reduce_on_host(sums, sums_at, rows, layouts, rank, value_dtype, residuals):
    """reduce, tensor by tensor with owner_keeps: each one's rows cut to their counts (read) and
    read back by wire_columns, their indices made unique by torch.unique."""
    rooms = owner_rooms(layouts, rank)
    room_at = offsets_of(rooms)
    values = sums.new_empty(sum(rooms) + 1, dtype=value_dtype)
    index, kept_counts = torch.zeros(sum(rooms) + 1, dtype=torch.int32, device=sums.device), []
    counts = rows.counts.tolist()
    for t, (layout, residual) in enumerate(zip(layouts, residuals)):
        low, size = layout.owned(rank)
        first = rows.row_at[t]
        sent = torch.cat([rows.rows[s, first : first + counts[s][t]] for s in range(rows.rows.shape[0])])
        owned = torch.unique(ops.wire_columns(sent, value_dtype)[1]) + low
        kept, owned = owner_keeps(
            sums[sums_at[t] : sums_at[t] + size], owned, low, layout.per_rank, value_dtype, residual
        )
        at = room_at[t]
        values[at : at + kept.numel()], index[at : at + kept.numel()] = kept, owned - low
        kept_counts.append(kept.numel())
    return values, index, torch.tensor(kept_counts, dtype=torch.int64, device=sums.device), rooms
