"""The wire formats' ops (sparsecomm/core/wire.py): the rows of index and value bytes
(wire_rows, wire_columns, sparse_unpack_rows) and the 1-/2-bit segments (quantized_segment,
sparse_unpack_segments), against rows and segments built in numpy, with their error messages."""

import numpy as np
import pytest
import reference
import torch
from cases import DTYPES, gathered_selections

from sparsecomm.core import wire
from sparsecomm.torch import ops


def _reference_rows(values, index, start, length):
    """sparsecomm.core.wire's rows of a send of [start, start + length) built in numpy, byte by
    byte: for each bucket the range touches, a marker row (0xFFFF, the bucket's number, zeros),
    then each of its elements' uint16 offset (little-endian, as in memory) and value bytes."""
    size = values.element_size()
    value_bytes = values.view({4: torch.int32, 2: torch.int16}[size]).numpy().view(np.uint8).reshape(-1, size)
    index = index.numpy().astype(np.int64)
    rows = []
    for bucket in range(start // wire.BUCKET, start // wire.BUCKET + wire.buckets(start, length)):
        marker = np.zeros(2 + size, np.uint8)
        marker[:4] = np.array([0xFFFF, bucket], "<u2").view(np.uint8)
        rows.append(marker)
        for j in np.flatnonzero(index // wire.BUCKET == bucket):
            offset = np.array([index[j] - bucket * wire.BUCKET], "<u2").view(np.uint8)
            rows.append(np.concatenate([offset, value_bytes[j]]))
    return np.stack(rows) if rows else np.zeros((0, 2 + size), np.uint8)


def _rows_of_ranks(values, index, ranks, numel):
    """Each rank's send of the whole tensor (gathered_selections' equal parts), in rank order."""
    part = index.numel() // ranks
    sends = [
        _reference_rows(values[r * part : (r + 1) * part], index[r * part : (r + 1) * part], 0, numel)
        for r in range(ranks)
    ]
    return torch.from_numpy(np.concatenate(sends))


# (start, length, indices): a whole small tensor; a range across three buckets with the
# extremes of each (offsets 0 and 65,534); a SparDL block starting inside a bucket; the last
# bucket of the largest tensor (bucket number 32,768, index 2^31 - 1); an empty range.
RANGES = [
    (0, 1_000, [0, 7, 999]),
    (0, 200_000, [0, 65_534, 65_535, 131_069, 131_070, 199_999]),
    (70_000, 100_000, [70_000, 131_069, 169_999]),
    (2**31 - 70_000, 70_000, [2**31 - 70_000, 2**31 - 1]),
    (5, 0, []),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("start,length,chosen", RANGES)
def test_wire_rows_are_markers_then_offsets_and_values_and_split_back_exactly(device, dtype, start, length, chosen):
    index = torch.tensor(chosen, dtype=torch.int32)
    values = torch.randn(index.numel(), generator=torch.Generator().manual_seed(length)).to(dtype)
    values[:1] = float("nan")  # bytes travel as they are, NaN included
    rows = ops.wire_rows(values.to(device), index.to(device), start, length)
    assert rows.dtype == torch.uint8 and rows.shape == (
        index.numel() + wire.buckets(start, length),
        2 + values.element_size(),
    )
    assert rows.numel() == wire.rows_bytes(index.numel(), values.element_size(), start, length)
    assert np.array_equal(rows.cpu().numpy(), _reference_rows(values, index, start, length))
    got_values, got_index = ops.wire_columns(rows, dtype)
    assert got_values.dtype == dtype and got_index.dtype == torch.int32
    assert torch.equal(got_values.cpu().view(torch.uint8), values.view(torch.uint8))
    assert torch.equal(got_index.cpu(), index)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("start,length,chosen", RANGES)
def test_wire_rows_into_writes_the_same_bytes_where_they_travel(device, dtype, start, length, chosen):
    """Into a region of a larger chunk (as a DDP bucket's): the bytes of wire_rows, the
    neighbours untouched."""
    index = torch.tensor(chosen, dtype=torch.int32, device=device)
    values = torch.randn(index.numel(), generator=torch.Generator().manual_seed(length)).to(dtype).to(device)
    want = ops.wire_rows(values, index, start, length).view(-1)
    chunk = torch.full((want.numel() + 16,), 0xAB, dtype=torch.uint8, device=device)
    region = chunk[8 : 8 + want.numel()]
    assert ops.wire_rows_into(values, index, start, length, out=region) is region
    assert torch.equal(region, want)
    assert torch.equal(chunk[:8], chunk.new_full((8,), 0xAB)) and torch.equal(chunk[-8:], chunk.new_full((8,), 0xAB))


def test_wire_rows_into_names_an_out_of_the_wrong_size():
    values, index = torch.randn(3), torch.tensor([0, 5, 9], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"wire_rows_into: out should be a contiguous uint8 tensor of 24 bytes on "):
        ops.wire_rows_into(values, index, 0, 10, out=torch.empty(23, dtype=torch.uint8))
    with pytest.raises(
        RuntimeError, match=r"wire_rows_into: values and index should have the same length, got 3 and 2"
    ):
        ops.wire_rows_into(values, index[:2], 0, 10, out=torch.empty(24, dtype=torch.uint8))


def test_wire_rows_many_into_writes_each_send_as_wire_rows_into_does(device):
    """Every whole send of RANGES' sizes (an empty one and a 200,000-element one among them) and
    each dtype, at its offset in one chunk, gaps between them: the bytes of wire_rows, the gaps
    untouched. No send at all leaves the chunk as it was."""
    sends = []
    for i, (dtype, (_, length, chosen)) in enumerate(zip(DTYPES * 2, RANGES[:3] + [(0, 0, [])] + RANGES[:2])):
        index = torch.tensor([c % max(length, 1) for c in chosen][: length and None], dtype=torch.int32)
        index = index.unique().to(torch.int32)  # ascending, distinct, inside [0, length)
        values = torch.randn(index.numel(), generator=torch.Generator().manual_seed(i)).to(dtype)
        sends.append((values.to(device), index.to(device), length))
    wants = [ops.wire_rows(values, index, 0, length).view(-1) for values, index, length in sends]
    places, offset = [], 8
    for want, (_, _, length) in zip(wants, sends):
        places.append((offset, length))
        offset += want.numel() + 5  # a gap after each
    chunk = torch.full((offset,), 0xAB, dtype=torch.uint8, device=device)
    expected = chunk.clone()
    for want, (at, _) in zip(wants, places):
        expected[at : at + want.numel()] = want
    got = ops.wire_rows_many_into([s[0] for s in sends], [s[1] for s in sends], places, out=chunk)
    assert got is chunk and torch.equal(chunk, expected)
    untouched = chunk.clone()
    assert torch.equal(ops.wire_rows_many_into([], [], [], out=chunk), untouched)


def test_wire_rows_many_into_names_what_does_not_fit():
    values, index = torch.randn(3), torch.tensor([0, 5, 9], dtype=torch.int32)
    out = torch.empty(30, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"wire_rows_many_into: send 1's 24 bytes at 7 do not fit out's 30"):
        ops.wire_rows_many_into([values, values], [index, index], [(0, 10), (7, 10)], out=out)
    with pytest.raises(RuntimeError, match=r"wire_rows_many_into: index should hold one tensor and places two numbers"):
        ops.wire_rows_many_into([values], [index, index], [(0, 10)], out=out)
    with pytest.raises(RuntimeError, match=r"wire_rows_many_into: out should be a contiguous 1-D uint8 tensor"):
        ops.wire_rows_many_into([values], [index], [(0, 10)], out=torch.empty(30))
    with pytest.raises(RuntimeError, match=r"wire_rows_many_into: 3 elements do not fit a range of 2"):
        ops.wire_rows_many_into([values], [index], [(0, 2)], out=out)


def test_wire_columns_read_sends_one_after_another_as_an_alltoall_brings_them(device):
    """SparDL's owner reads every rank's send of its block, concatenated: each send's first
    marker resets the bucket, even to a lower one."""
    numel, ranks = 300_000, 3
    values, index = gathered_selections(numel, 500, ranks, torch.float32, seed=3)
    rows = _rows_of_ranks(values, index, ranks, numel)
    got_values, got_index = ops.wire_columns(rows.to(device), torch.float32)
    assert torch.equal(got_index.cpu(), index) and torch.equal(got_values.cpu(), values)


def test_a_send_costs_two_bytes_of_index_an_element_and_a_row_a_bucket():
    """The figure the issue asks for: DGC 0.1% of a 4M-element float32 tensor."""
    k, numel = 4_000, 4_000_000
    assert wire.buckets(0, numel) == 62 and wire.rows_bytes(k, 4, 0, numel) == (k + 62) * 6
    assert wire.rows_bytes(k, 4, 0, numel) / (k * 8) < 0.77  # int32 index + value: 8 bytes a pair
    assert wire.rows_bytes(k, 2, 0, numel) / (k * 6) < 0.68  # a 16-bit value
    assert [wire.buckets(s, n) for s, n in [(0, 0), (0, 1), (0, 65_535), (0, 65_536), (65_534, 2)]] == [0, 1, 1, 2, 2]


# (scale, divisor) of the unpack ops: a number, or a 1-element tensor read where the op runs
# (Horovod's reduced placeholder: 1.0 for Average, the ranks for Sum) over the ranks.
UNPACK_SCALES = [(1 / 3, 1), (1.0, 3), (3.0, 3), (5.0, 2)]


def _unpack_scale(scale, divisor, scale_form, device):
    """(the scale argument in the form asked, the factor it means: scale / divisor in double,
    rounded to float32 as the kernels do)."""
    given = torch.tensor([scale], device=device) if scale_form == "tensor" else scale
    return given, float(torch.tensor(float(torch.tensor(scale)) / divisor))


@pytest.mark.parametrize("scale_form", ["tensor", "number"])
@pytest.mark.parametrize("scale,divisor", UNPACK_SCALES)
@pytest.mark.parametrize(
    "value_dtype,dtype",
    [
        (torch.float32, torch.float32),
        (torch.float16, torch.float16),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
    ],
)
def test_sparse_unpack_rows_equals_sparse_unpack_of_the_columns(device, value_dtype, dtype, scale, divisor, scale_form):
    """Gathered rows of 3 ranks (overlapping index-ordered selections, values in value_dtype:
    fp16/bf16 values of a float32 gradient too) into a stale out: the sum, cast, scaled by
    scale / divisor."""
    values, index = gathered_selections(70_000, 2000, 3, value_dtype, seed=6)
    rows = _rows_of_ranks(values, index, 3, 70_000)
    given, factor = _unpack_scale(scale, divisor, scale_form, device)
    want = (torch.zeros(70_000).index_add_(0, index.long(), values.float()) * factor).to(dtype)
    out = torch.full((70_000,), 7.0, dtype=dtype, device=device)
    assert ops.sparse_unpack_rows(rows.to(device), value_dtype, 70_000, given, divisor, out=out) is out
    assert torch.equal(out.cpu(), want)


def test_segments_name_an_index_out_of_order_or_counts_that_do_not_add_up_on_the_cpu():
    ((codes, scales, _, index),) = reference.quantized_ranks(100, [20], 2, seed=1)
    codes, scales, index = (torch.from_numpy(x) for x in (codes, scales, index))
    with pytest.raises(RuntimeError, match=r"quantized_segment: index should be strictly ascending and below numel"):
        ops.quantized_segment(codes, scales, index.flip(0), 2, 100)
    segment = ops.quantized_segment(codes, scales, index, 2, 100)
    layout = wire.Segment(20, scales.numel(), 2, 100)
    segment[layout.counts] -= 1  # 19 in the one bucket, for a count of 20
    with pytest.raises(RuntimeError, match=r"sparse_unpack_segments: a segment's bucket counts do not add up"):
        ops.sparse_unpack_segments(segment, 2, 1, 100, out=torch.empty(100))


def test_wire_rows_name_an_index_out_of_order_or_range_on_the_cpu():
    """The CPU pass checks the order and range it writes; CUDA does not (it would need a host
    synchronisation, as check_index_range)."""
    values, index = torch.randn(20), torch.arange(0, 40, 2, dtype=torch.int32)
    rows = ops.wire_rows(values, index, 0, 40)
    for bad in (index.flip(0), index + 2, index - 1):  # out of order; past the range's end; before its start
        with pytest.raises(RuntimeError, match=r"strictly ascending and inside \[start, start \+ length\) = \[1, 40\)"):
            ops.wire_rows(values, bad, 1, 39)
    with pytest.raises(
        RuntimeError, match=r"wire_rows: \[start, start \+ length\) should lie in \[0, 2\^31\), got start -1"
    ):
        ops.wire_rows(values, index, -1, 40)
    with pytest.raises(RuntimeError, match=r"wire rows: an element comes before its bucket's marker row"):
        ops.wire_columns(rows[1:], torch.float32)


@pytest.mark.usefixtures("host_binding")
def test_wire_rows_ops_pass_opcheck_and_name_bad_rows():
    values, index = torch.randn(20), torch.arange(0, 40, 2, dtype=torch.int32)
    rows = ops.wire_rows(values, index, 0, 40)
    torch.library.opcheck(ops._ops.wire_rows.default, (values, index, 0, 40))
    torch.library.opcheck(ops._ops.wire_columns.default, (rows, torch.float32))
    torch.library.opcheck(ops._ops.wire_rows_into.default, (values, index, 0, 40, torch.empty(126, dtype=torch.uint8)))
    torch.library.opcheck(
        ops._ops.wire_rows_many_into.default, ([values], [index], [4, 40], torch.empty(130, dtype=torch.uint8))
    )
    torch.library.opcheck(
        ops._ops.sparse_unpack_rows_into.default, (rows, torch.float32, torch.tensor([2.0]), 4, torch.empty(40))
    )
    with pytest.raises(
        RuntimeError,
        match=r"sparse_unpack_rows: rows should be a 2-D uint8 tensor of 4 columns \(a "
        r"uint16 offset, then a Half value\), got 2-D Byte of shape \[21, 6\]",
    ):
        ops.sparse_unpack_rows(rows, torch.float16, 40, out=torch.empty(40, dtype=torch.float16))
    with pytest.raises(RuntimeError, match=r"wire_rows: values and index should have the same length, got 20 and 19"):
        ops.wire_rows(values, index[1:], 0, 40)
    with pytest.raises(RuntimeError, match=r"wire_rows: values should be float32, float16 or bfloat16, got Double"):
        ops.wire_rows(values.double(), index, 0, 40)
    with pytest.raises(ValueError, match=r"sparse_unpack_rows: out should have numel 41, got 40"):
        ops.sparse_unpack_rows(rows, torch.float32, 41, out=torch.empty(40))
    for op, args in (("sparse_unpack_rows", (rows, torch.float32, 40)), ("sparse_unpack_segments", None)):
        if args is None:
            ((codes, scales, _, idx),) = reference.quantized_ranks(40, [5], 2, seed=2)
            args = (ops.quantized_segment(*(torch.from_numpy(x) for x in (codes, scales, idx)), 2, 40), 2, 1, 40)
        unpack = getattr(ops, op)
        with pytest.raises(RuntimeError, match=op + r": scale should be a 1-element float32 tensor, got 2 Float"):
            unpack(*args, torch.ones(2), out=torch.empty(40))
        with pytest.raises(RuntimeError, match=op + r": scale should be a 1-element float32 tensor, got 1 Double"):
            unpack(*args, torch.ones(1, dtype=torch.float64), out=torch.empty(40))
        with pytest.raises(RuntimeError, match=op + r": divisor should be >= 1, got 0"):
            unpack(*args, torch.ones(1), 0, out=torch.empty(40))


@pytest.mark.parametrize("bits", [1, 2])
@pytest.mark.parametrize("count", [0, 1, 5, 257])
def test_quantized_segment_holds_count_scales_offsets_codes_and_padding(device, bits, count):
    """A tensor of 4 buckets, the last one partial."""
    ((codes, scales, _, index),) = reference.quantized_ranks(200_000, [count], bits, seed=count)
    got = ops.quantized_segment(*(torch.from_numpy(x).to(device) for x in (codes, scales, index)), bits, 200_000)
    want = reference.quantized_segment(codes, scales, index, 200_000)
    assert got.dtype == torch.uint8 and np.array_equal(got.cpu().numpy(), want)
    assert got.numel() == wire.Segment(count, scales.size, bits, 200_000).size


@pytest.mark.parametrize("scale_form", ["tensor", "number"])
@pytest.mark.parametrize("scale,divisor", UNPACK_SCALES[:2])
@pytest.mark.parametrize("bits", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sparse_unpack_segments_decodes_each_rank_with_its_scales(device, bits, dtype, scale, divisor, scale_form):
    """3 ranks' segments (overlapping indices; one rank sent nothing) gathered in rank order, into
    a stale out: each rank's codes decoded with its own scales, cast to out's dtype, summed in
    rank order and scaled by scale / divisor."""
    ranks = reference.quantized_ranks(70_000, [3000, 0, 2500], bits, seed=bits)
    gathered = torch.from_numpy(np.concatenate([reference.quantized_segment(c, s, i, 70_000) for c, s, _, i in ranks]))
    given, factor = _unpack_scale(scale, divisor, scale_form, device)
    want = torch.zeros(70_000)
    for _, _, decoded, index in ranks:
        want.index_add_(0, torch.from_numpy(index).long(), torch.from_numpy(decoded).to(dtype).float())
    want = (want * factor).to(dtype)
    out = torch.full((70_000,), 7.0, dtype=dtype, device=device)
    assert ops.sparse_unpack_segments(gathered.to(device), bits, 3, 70_000, given, divisor, out=out) is out
    assert torch.equal(out.cpu(), want)


@pytest.mark.usefixtures("host_binding")
def test_segment_ops_pass_opcheck_and_name_bad_segments():
    ((codes, scales, _, index),) = reference.quantized_ranks(100, [20], 2, seed=1)
    codes, scales, index = (torch.from_numpy(x) for x in (codes, scales, index))
    segment = ops.quantized_segment(codes, scales, index, 2, 100)
    torch.library.opcheck(ops._ops.quantized_segment.default, (codes, scales, index, 2, 100))
    torch.library.opcheck(
        ops._ops.sparse_unpack_segments_into.default, (segment, 2, 1, torch.tensor([0.5]), 1, torch.empty(100))
    )
    with pytest.raises(
        RuntimeError,
        match=r"quantized_segment: codes should have 5 bytes for 20 values of 2 bits, "
        r"got 4",
    ):
        ops.quantized_segment(codes[:4], scales, index, 2, 100)
    with pytest.raises(
        RuntimeError,
        match=r"sparse_unpack_segments: gathered \(\d+ bytes\) should hold 2 segments, "
        r"got 1",
    ):
        ops.sparse_unpack_segments(segment, 2, 2, 100, out=torch.empty(100))
    with pytest.raises(
        RuntimeError,
        match=r"sparse_unpack_segments: 1 segments of a tensor of 100 elements should fill gathered "
        r"\(\d+ bytes\), got \d+ bytes",
    ):
        ops.sparse_unpack_segments(torch.cat([segment, segment[:8]]), 2, 1, 100, out=torch.empty(100))
    broken = segment.clone()
    broken[:8] = torch.tensor([2**40], dtype=torch.int64).view(torch.uint8)
    with pytest.raises(
        RuntimeError,
        match=r"sparse_unpack_segments: segment 0 at byte 0 has a count of "
        r"1099511627776, which does not fit",
    ):
        ops.sparse_unpack_segments(broken, 2, 1, 100, out=torch.empty(100))
