"""SparDL's choices at fixed capacity for a bucket of tensors (sparsecomm.torch.spardl_fixed, the
DDP hook's spardl route), decided on the device and on the host, against the functions the
Horovod exchange runs (exchange.spardl_split and spardl_reduce): the same wire rows and the same
residuals, bit for bit, for every rank of several layouts at once, in float32, bfloat16 and
float16, with ties, NaN, +-inf and -0. One process, no collective."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sparsecomm.core.exchange import Packed
from sparsecomm.core.plan import SparDLLayout
from sparsecomm.torch import exchange, ops, spardl_fixed
from sparsecomm.torch.exchange import Wire, spardl_reduce, spardl_split

# (numel, k, selected) of a bucket's tensors: several buckets a block, blocks smaller than
# per_rank, a tensor smaller than the ranks
TENSORS = [(300_000, 3000, 3900), (1000, 10, 30), (50, 20, 26), (7, 2, 5), (10, 3, 4)]
ROOM = 5  # entries past a selection's count, holding garbage
WAYS = ["_split_on_device", "_split_on_host"], ["_reduce_on_device", "_reduce_on_host"]


def bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def selection(gen, numel, count, dtype, kind):
    index = torch.randperm(numel, generator=gen)[:count].sort().values.int()
    if kind == "ties":
        values = torch.randint(-3, 4, (count,), generator=gen).float()
    else:
        values = torch.randn(count, generator=gen)
    if kind == "nonfinite":
        values[: min(count, 4)] = torch.tensor([-0.0, float("nan"), float("inf"), -float("inf")])[: min(count, 4)]
    return values.to(dtype), index


def rows_of(values, index, count, layout, owner):
    low, size = layout.owned(owner)
    return ops.wire_rows(values[:count], index[:count] + low, low, size)


CASES = [
    (ranks, dtype, kind)
    for ranks in (1, 2, 3, 4)
    for dtype in (torch.float32, torch.bfloat16, torch.float16)
    for kind in ("random", "ties", "nonfinite")
]


@pytest.mark.parametrize("way", WAYS[0])
@pytest.mark.parametrize("ranks, dtype, kind", CASES)
def test_the_split_sends_each_owner_the_host_sized_rows(way, ranks, dtype, kind):
    layouts = [SparDLLayout.of(numel, k, ranks) for numel, k, _ in TENSORS]
    gen = torch.Generator().manual_seed(ranks)
    for rank in range(ranks):
        chosen = [selection(gen, numel, selected, dtype, kind) for numel, _, selected in TENSORS]
        residuals = [torch.randn(numel, generator=gen) for numel, _, _ in TENSORS]
        on_ours = [r.clone() for r in residuals]
        want = [spardl_split(Packed(*c), m, rank, r) for c, m, r in zip(chosen, layouts, residuals)]
        roomy = [
            (
                torch.cat([v, torch.full((ROOM,), 7.0, dtype=dtype)]),
                torch.cat([i, torch.full((ROOM,), 99, dtype=torch.int32)]),
                torch.tensor([i.numel()]),
            )
            for v, i in chosen
        ]
        got = getattr(spardl_fixed, way)(roomy, layouts, rank, on_ours)
        for t, layout in enumerate(layouts):
            assert torch.equal(bits(on_ours[t]), bits(residuals[t])), f"rank {rank}, tensor {t}: the residual"
            assert int(got.counts[t, rank]) == 0
            for owner in range(ranks):
                if owner == rank:
                    at, count, v, i = got.own_at[t], int(got.own_counts[t]), got.own_values, got.own_index
                else:
                    at = got.send_at[t] + owner * layout.per_rank
                    count, v, i = int(got.counts[t, owner]), got.send_values, got.send_index
                rows = rows_of(v[at:], i[at:], count, layout, owner)
                assert torch.equal(rows, want[t][owner]), f"rank {rank}, tensor {t}: the rows for owner {owner}"


def arrived_rows(gen, parts_of, layouts, rank, dtype):
    """An Arrived of each tensor's parts (each sender's rows for `rank`'s block, absolute),
    re-encoded relative to the block, each region padded with garbage past its count."""
    senders, width = len(parts_of[0]), parts_of[0][0].shape[1]
    relative = []
    for parts, layout in zip(parts_of, layouts):
        low, size = layout.owned(rank)
        columns = [ops.wire_columns(part, dtype) for part in parts]
        relative.append([ops.wire_rows(v, i - low, 0, size) for v, i in columns])
    room = [max(r.shape[0] for r in rows) + ROOM for rows in relative]
    rows = torch.randint(0, 256, (senders, sum(room), width), dtype=torch.uint8, generator=gen)
    counts = torch.zeros(senders, len(room), dtype=torch.int64)
    for t, (at, sent) in enumerate(zip(spardl_fixed.offsets_of(room), relative)):
        for s, r in enumerate(sent):
            rows[s, at : at + r.shape[0]], counts[s, t] = r, r.shape[0]
    return spardl_fixed.Arrived(rows, counts, spardl_fixed.offsets_of(room), room)


@pytest.mark.parametrize("way", WAYS[1])
@pytest.mark.parametrize("ranks, dtype, kind", CASES)
def test_the_owner_keeps_the_host_sized_sums(way, ranks, dtype, kind):
    layouts = [SparDLLayout.of(numel, k, ranks) for numel, k, _ in TENSORS]
    gen = torch.Generator().manual_seed(100 + ranks)
    for rank in range(ranks):
        sums, parts_of, want, residuals, on_ours = [], [], [], [], []
        for (numel, k, selected), layout in zip(TENSORS, layouts):
            low, size = layout.owned(rank)
            chosen = [selection(gen, numel, selected, dtype, kind) for _ in range(ranks)]
            parts = [spardl_split(Packed(*c), layout, r, None)[rank] for r, c in enumerate(chosen)]
            residual = torch.randn(numel, generator=gen)
            on_ours.append(residual.clone())
            residuals.append(residual)
            wire = Wire("w", torch.Size([numel]), dtype, None, ranks, k, residual, torch.empty(numel, dtype=dtype))
            values, index = ops.wire_columns(torch.cat(parts), dtype)
            sums.append(ops.sparse_unpack(values.float(), index - low, size))
            want.append(spardl_reduce(parts, layout, rank, dtype, wire))
            parts_of.append(parts)
        arrived = arrived_rows(gen, parts_of, layouts, rank, dtype)
        sums_at = spardl_fixed.offsets_of([s.numel() for s in sums])
        got = getattr(spardl_fixed, way)(torch.cat(sums), sums_at, arrived, layouts, rank, dtype, on_ours)
        values, index, counts, rooms = got
        room_at = spardl_fixed.offsets_of(rooms)
        for t, layout in enumerate(layouts):
            assert torch.equal(bits(on_ours[t]), bits(residuals[t])), f"rank {rank}, tensor {t}: the residual"
            rows = rows_of(values[room_at[t] :], index[room_at[t] :], int(counts[t]), layout, rank)
            assert torch.equal(rows, want[t]), f"rank {rank}, tensor {t}: the rows"


def test_the_arrived_rows_read_back_to_their_indices_past_markers_and_counts():
    """Rows of 3 senders for 2 tensors (blocks of 3 buckets and of 1), each padded with garbage
    past its count: the decoded indices are the rows' own (wire_columns'), tensor by tensor and
    row by row; the markers and the padding read as the tensor's size."""
    sizes, rooms, gen = [150_000, 100], [43, 12], torch.Generator().manual_seed(3)
    table = torch.randint(0, 256, (3, sum(rooms), 6), dtype=torch.uint8, generator=gen)
    counts, want = torch.zeros(3, 2, dtype=torch.int64), [[], []]
    for t, (size, at) in enumerate(zip(sizes, [0, rooms[0]])):
        for sender, count in enumerate([[40, 0, 17], [9, 3, 0]][t]):
            index = torch.randperm(size, generator=gen)[:count].sort().values.int()
            rows = ops.wire_rows(torch.randn(count, generator=gen), index, 0, size)
            table[sender, at : at + rows.shape[0]] = rows
            counts[sender, t] = rows.shape[0]
            want[t].append((sender, index.long()))
    index, item = spardl_fixed.arrived_index(spardl_fixed.Arrived(table, counts, [0, rooms[0]], rooms), sizes)
    for t, size in enumerate(sizes):
        mine = index[item == t].view(-1, 3)  # (row, sender)
        for sender, expected in want[t]:
            column = mine[:, sender]
            assert torch.equal(column[column < size], expected), (t, sender)
        assert int((mine == size).sum()) == mine.numel() - sum(e.numel() for _, e in want[t])


class HostMade(TorchDispatchMode):
    """Counts the tensors made from host data (torch.tensor's op): on a GPU, each is a copy."""

    def __init__(self):
        super().__init__()
        self.made = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.made += func is torch.ops.aten.lift_fresh.default
        return func(*args, **(kwargs or {}))


def test_the_device_way_makes_a_layouts_tables_once():
    """A second step of the same layouts makes no tensor from host ints: their sizes and offsets
    come from the cache (exchange.layout_ints_on), so a GPU's step copies none to the device."""
    ranks, rank, dtype, gen = 3, 1, torch.float32, torch.Generator().manual_seed(7)
    layouts = [SparDLLayout.of(numel, k, ranks) for numel, k, _ in TENSORS]
    chosen = [(*selection(gen, n, s, dtype, "random"), None) for n, _, s in TENSORS]
    parts_of = [
        [spardl_split(Packed(*selection(gen, n, s, dtype, "random")), m, r, None)[rank] for r in range(ranks)]
        for (n, _, s), m in zip(TENSORS, layouts)
    ]
    arrived = arrived_rows(gen, parts_of, layouts, rank, dtype)
    sizes = [m.owned(rank)[1] for m in layouts]
    sums, residuals = torch.randn(sum(sizes), generator=gen), [torch.zeros(n) for n, _, _ in TENSORS]
    made = []
    exchange._layout_ints_on.cache_clear()
    for _ in range(2):
        with HostMade() as counter:
            spardl_fixed._split_on_device(chosen, layouts, rank, residuals)
            spardl_fixed._reduce_on_device(
                sums, spardl_fixed.offsets_of(sizes), arrived, layouts, rank, dtype, residuals
            )
        made.append(counter.made)
    assert made[0] > 0 and made[1] == 0, made


class Ops(TorchDispatchMode):
    """Counts every op the dispatcher sees."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def split_ops(tensors, ranks=2, rank=0):
    """The ops of spardl_fixed.split of a bucket of `tensors` (numel, k), a step after the first."""
    gen = torch.Generator().manual_seed(3)
    layouts = [SparDLLayout.of(numel, k, ranks) for numel, k in tensors]
    chosen = [(*selection(gen, numel, k, torch.float32, "random"), None) for numel, k in tensors]
    residuals = [torch.zeros(numel) for numel, _ in tensors]
    spardl_fixed.split(chosen, layouts, rank, residuals)
    with Ops() as counter:
        spardl_fixed.split(chosen, layouts, rank, residuals)
    return counter.n


@pytest.mark.parametrize("k, way", [(8, "device"), (2 * spardl_fixed.FEW_ROWS, "host")])
def test_a_cpu_takes_the_device_way_where_the_tensors_send_few_rows(k, way):
    """On a CPU, where reads cost nothing, a bucket whose tensors send few rows each still takes
    the device's way (ops per bucket: a tensor adds about two), and one whose tensors send many
    the host-sized way (ops per tensor), whichever is faster there (docs/kernels.md)."""
    per_tensor = (split_ops([(20_000, k)] * 32) - split_ops([(20_000, k)] * 8)) / 24
    assert (per_tensor < 6) == (way == "device"), per_tensor
