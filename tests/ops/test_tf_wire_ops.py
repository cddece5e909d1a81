"""TF's wire-row ops (SparsecommWireRows, SparsecommWireColumns: sparsecomm/core/wire.py's rows)
against the graph-op implementation the TF exchange used before them, kept here as the
reference: the same bytes and the same (values, index), bit for bit, eager and in tf.function,
for one and for several buckets, ranges that start inside a bucket (SparDL's blocks), empty
sends, the three value dtypes, and sends read back one after another as a gather brings them."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
from sparsecomm.core import wire  # noqa: E402
from sparsecomm.tensorflow import exchange, ops  # noqa: E402

DTYPES = [tf.float32, tf.float16, tf.bfloat16]


# ---- The reference: the TF exchange's _rows and _from_rows as graph ops, as they were ----


def _bytes(tensor, shape):
    return tf.reshape(tf.bitcast(tensor, tf.uint8), shape)


def _view(data, dtype):
    return tf.bitcast(tf.reshape(data, [-1, dtype.size]), dtype)


def _u16_bytes(ints):
    return _bytes(tf.cast(ints, tf.uint16), [-1, 2])


def reference_rows(values, index, start, length):
    """Element j goes to row j + (its bucket - the first) + 1, marker i to row i + the elements
    of the buckets before it."""
    first, n = start // wire.BUCKET, wire.buckets(start, length)
    index = tf.cast(index, tf.int64)
    bucket = index // wire.BUCKET
    elements = tf.concat([_u16_bytes(index - bucket * wire.BUCKET), _bytes(values, [-1, values.dtype.size])], 1)
    numbers = tf.range(first, first + n, dtype=tf.int64)
    padding = tf.zeros([n, values.dtype.size - 2], tf.uint8)
    markers = tf.concat([_u16_bytes(tf.fill([n], tf.constant(wire.MARKER, tf.int64))), _u16_bytes(numbers), padding], 1)
    k = tf.size(index, out_type=tf.int64)
    places = tf.concat(
        [
            tf.range(k) + bucket - first + 1,
            tf.range(n, dtype=tf.int64) + tf.searchsorted(bucket, numbers, out_type=tf.int64),
        ],
        0,
    )
    return tf.gather(tf.concat([elements, markers], 0), tf.math.invert_permutation(places))


def reference_columns(rows, value_dtype):
    offsets = tf.cast(_view(rows[:, :2], tf.uint16), tf.int64)
    is_marker = tf.equal(offsets, wire.MARKER)
    numbers = tf.boolean_mask(tf.cast(_view(rows[:, 2:4], tf.uint16), tf.int64), is_marker)
    last = tf.maximum(tf.cumsum(tf.cast(is_marker, tf.int64)) - 1, 0)
    index = tf.gather(numbers, last) * wire.BUCKET + offsets
    keep = tf.logical_not(is_marker)
    return tf.boolean_mask(_view(rows[:, 2:], value_dtype), keep), tf.cast(tf.boolean_mask(index, keep), tf.int32)


# ---- Inputs ----


def _values(count, dtype, seed):
    """Random bit patterns of `dtype` (NaNs with payloads, infinities, subnormals, -0.0 among
    them), which must travel untouched, the first ones chosen: a quiet NaN, a signalling one
    with its sign, -0.0, a number."""
    unsigned = np.uint32 if dtype.size == 4 else np.uint16
    bits = np.random.default_rng(seed).integers(0, 2 ** (8 * dtype.size), count, dtype=np.uint64).astype(unsigned)
    chosen = [0x7FC00000, 0xFF800001, 0x80000000, 0x3F800000] if dtype.size == 4 else [0x7E01, 0xFC01, 0x8000, 0x3C00]
    bits[: min(count, 4)] = chosen[:count]
    return tf.bitcast(tf.constant(bits), dtype)


def _selection(start, length, count, seed):
    """`count` distinct indices of [start, start + length), ascending, int32."""
    chosen = np.random.default_rng(seed).choice(length, size=count, replace=False)
    return tf.constant(np.sort(chosen + start).astype(np.int32))


def _same(got, want):
    """Equal bits and dtype (values compared as their unsigned integers: NaNs too)."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    as_bits = {4: tf.uint32, 2: tf.uint16}
    if got.dtype.is_floating:
        got, want = tf.bitcast(got, as_bits[got.dtype.size]), tf.bitcast(want, as_bits[want.dtype.size])
    np.testing.assert_array_equal(got.numpy(), want.numpy())


# (start, length, indices): a small tensor; three buckets with each one's extremes (offsets 0
# and 65,534); a SparDL block starting inside a bucket and ending inside another; the last bucket
# of the largest tensor (bucket 32,768, index 2^31 - 1); a range without elements (markers
# only); an empty range; an empty range starting past bucket 0.
RANGES = [
    (0, 1_000, [0, 7, 999]),
    (0, 200_000, [0, 65_534, 65_535, 131_069, 131_070, 199_999]),
    (70_000, 100_000, [70_000, 131_069, 131_070, 169_999]),
    (2**31 - 70_000, 70_000, [2**31 - 70_000, 2**31 - 65_536, 2**31 - 65_535, 2**31 - 1]),
    (65_000, 140_000, []),
    (5, 0, []),
    (300_000, 0, []),
]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("start,length,chosen", RANGES)
def test_rows_and_columns_equal_the_graph_ops_bit_for_bit(dtype, start, length, chosen, graph):
    index = tf.constant(chosen, tf.int32)
    values = _values(len(chosen), dtype, seed=length)
    build = tf.function(ops.wire_rows) if graph else ops.wire_rows
    read = tf.function(ops.wire_columns) if graph else ops.wire_columns
    rows = build(values, index, start, length)
    want = reference_rows(values, index, start, length)
    assert rows.shape == (len(chosen) + wire.buckets(start, length), 2 + dtype.size)
    _same(rows, want)
    got_values, got_index = read(rows, dtype)
    want_values, want_index = reference_columns(want, dtype)
    _same(got_values, want_values)
    _same(got_index, want_index)
    _same(got_index, index)
    _same(got_values, values)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("count", [0, 1, 50, 4_000])
def test_random_selections_of_a_large_tensor_equal_the_graph_ops(dtype, count):
    """A 4M-element tensor (62 buckets), whole and in SparDL's three blocks, built in tf.function
    by the exchange's own _rows."""
    numel, build = 4_000_000, tf.function(exchange._rows)
    block = -(-numel // 3)
    for start, length in [(0, numel)] + [(b * block, min(block, numel - b * block)) for b in range(3)]:
        index = _selection(start, length, count, seed=count + start)
        values = _values(int(index.shape[0]), dtype, seed=start)
        _same(build(values, index, start, length), reference_rows(values, index, start, length))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_sends_one_after_another_read_back_as_the_graph_ops(dtype, graph):
    """What _from_rows reads: an allgather's ranks' sends of the whole tensor (one of them empty),
    and an alltoall's sends of SparDL blocks in any order (each first marker resets the bucket,
    to a lower one too), with an empty send and a markers-only send among them."""
    numel, sends = 300_000, []
    for r, (start, length, count) in enumerate(
        [(0, numel, 900), (0, numel, 0), (0, numel, 1_200), (200_000, 100_000, 300), (0, 100_000, 250), (5, 0, 0)]
        + [(100_000, 100_000, 0), (70_000, 130_000, 700)]
    ):
        index = _selection(start, length, count, seed=r)
        sends.append(ops.wire_rows(_values(int(index.shape[0]), dtype, seed=r), index, start, length))
    gathered = tf.concat(sends, 0)
    read = tf.function(exchange._from_rows) if graph else exchange._from_rows
    got_values, got_index = read(gathered, dtype)
    want_values, want_index = reference_columns(gathered, dtype)
    assert int(got_index.shape[0]) == 900 + 1_200 + 300 + 250 + 700
    _same(got_values, want_values)
    _same(got_index, want_index)


def test_static_shapes_where_known():
    """rows: [k + buckets, 2 + value bytes] from k and the range; k unknown: the rows' count too.
    The columns' length depends on the data; rows of another width are refused when traced."""
    rows = tf.function(lambda v, i: ops.wire_rows(v, i, 70_000, 130_000)).get_concrete_function(
        tf.TensorSpec([7], tf.float16), tf.TensorSpec([7], tf.int32)
    )
    assert rows.output_shapes.as_list() == [7 + wire.buckets(70_000, 130_000), 4]
    unknown = tf.function(lambda v, i: ops.wire_rows(v, i, 0, 10)).get_concrete_function(
        tf.TensorSpec([None], tf.bfloat16), tf.TensorSpec([None], tf.int32)
    )
    assert unknown.output_shapes.as_list() == [None, 4]
    columns = tf.function(lambda r: ops.wire_columns(r, tf.float32)).get_concrete_function(
        tf.TensorSpec([None, 6], tf.uint8)
    )
    assert [s.as_list() for s in columns.output_shapes] == [[None], [None]]
    for shape, message in (([None, 4], "Dimension must be 6 but is 4"), ([3], "Shape must be rank 2 but is rank 1")):
        with pytest.raises(ValueError, match=message):
            tf.function(lambda r: ops.wire_columns(r, tf.float32)).get_concrete_function(tf.TensorSpec(shape, tf.uint8))
    with pytest.raises(ValueError, match=r"Dimensions must be equal, but are 3 and 4"):
        tf.function(lambda v, i: ops.wire_rows(v, i, 0, 10)).get_concrete_function(
            tf.TensorSpec([3], tf.float32), tf.TensorSpec([4], tf.int32)
        )
    with pytest.raises(ValueError, match=r"should lie in \[0, 2\^31\), got start 5, length 2147483644"):
        tf.function(lambda v, i: ops.wire_rows(v, i, 5, 2**31 - 4)).get_concrete_function(
            tf.TensorSpec([3], tf.float32), tf.TensorSpec([3], tf.int32)
        )


def test_bad_arguments_are_named():
    values, index = tf.ones([20]), tf.range(0, 40, 2)
    rows = ops.wire_rows(values, index, 0, 40)
    for bad in (index[::-1], index + 2, index - 1):  # out of order; past the range's end; before its start
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=r"wire_rows: index should be strictly ascending and inside \[start, start \+ length\) = \[1, 40\)",
        ):
            ops.wire_rows(values, bad, 1, 39)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"should lie in \[0, 2\^31\), got start 5, length 2147483644"
    ):
        ops.wire_rows(values, index, 5, 2**31 - 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"wire_rows: 20 elements do not fit a range of 19"):
        ops.wire_rows(values, index, 0, 19)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"values and index should be 1-D of the same length"):
        ops.wire_rows(values[1:], index, 0, 40)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"wire rows: an element comes before its bucket's marker"):
        ops.wire_columns(rows[1:], tf.float32)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"wire_columns: rows should be 2-D of 4 columns \(a uint16 offset, then a half value\), "
        r"got shape \[21,6\]",
    ):
        ops.wire_columns(rows, tf.float16)
