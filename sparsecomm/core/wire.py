"""What one rank puts on the wire for a gathered tensor: ONE buffer per tensor and step, so
one allgather carries it (not one per part). Written once here; torch builds and reads it with
the ops wire_rows, wire_columns and sparse_unpack_rows (csrc/torch/select.h), quantized_segment
and sparse_unpack_segments (csrc/torch/quantize.h, whose QuantizedSegment mirrors Segment
below); the TF exchange its rows with the ops SparsecommWireRows and SparsecommWireColumns
(csrc/tensorflow/select.cc, the torch ops' CPU launchers), its segments with TF graph ops. No
arithmetic on the values: the same bytes on every framework (tests/ops/test_torch_wire_ops.py
checks torch's against rows built in numpy, tests/ops/test_tf_select_ops.py TF's against
torch's, tests/ops/test_tf_wire_ops.py TF's ops against the graph ops that built them before).

Values and indices (allgather, SparDL, hierarchical, the DDP hook): uint8 rows of
``2 + value_bytes``, one row per sent element: its index's offset in its bucket (uint16), then
its value's bytes (the gradient's dtype, or the method's value_dtype), as in memory. A tensor
is cut into buckets of BUCKET elements; a send covers a range of the tensor (the whole of it,
or a SparDL block) and has, for every bucket the range touches, a marker row followed by the
rows of that bucket's elements in index order:

    marker   uint16 MARKER, then the bucket's number (uint16), then zeros to the row's width
    element  uint16 offset (index - bucket * BUCKET, below MARKER), then the value's bytes

So 2 bytes of index an element, plus one row a bucket (``buckets(start, length)``: known from
the range, so a send's size is too, without reading the data). The rows are self-describing:
ranks' sends concatenated (an allgather, an alltoall) read back by the same walk, whose index is
``bucket * BUCKET + offset`` of the last marker seen.

1-/2-bit codes: one uint8 segment per rank, its parts aligned for their dtypes:

    count    int64, 8 bytes         how many elements this rank sent
    scales   float32 x n_scales     the per-tensor class means (core.methods: 2 for 1 bit, 4 for 2)
    counts   uint16 x buckets       how many of them each bucket of the tensor holds
    offsets  uint16 x count         each index's offset in its bucket, in index order
    codes    ceil(count * bits / 8) bytes, then zero padding to a multiple of 8 bytes

A segment's offsets stand apart from its codes, so its buckets are told by counts (a bucket
holds at most 65,535 elements: a uint16) rather than by marker rows. Under Horovod the segments'
lengths differ per rank (count), so the reader walks them in rank order. Under DDP and FSDP each
is laid out for a room (the pack's capacity): ``Segment(room, ...)``'s offsets, whatever the count,
which the writer puts in its first 8 bytes on the device (csrc/kernels/quantize.h's
QuantizedSegment and write_fixed_segment_item); past the count nothing is written.
"""

from dataclasses import dataclass

INDEX_BYTES = 2  # a row's index: its offset in its bucket (uint16)
BUCKET = 65535  # elements a bucket: offsets 0..65534, MARKER left for the markers
MARKER = 0xFFFF
# Indices are int32 in memory: a tensor sent with indices has at most this many elements
# (core.plan.Planner.check_indexable)
MAX_INDEXED_NUMEL = 2**31 - 1
COUNT_BYTES = 8
SCALE_BYTES = 4


def buckets(start, length):
    """The number of buckets (marker rows) of a send covering [start, start + length)."""
    return 0 if length <= 0 else (start + length - 1) // BUCKET - start // BUCKET + 1


def row_bytes(value_bytes):
    """A wire row's bytes: its index, then its value."""
    return INDEX_BYTES + value_bytes


def rows_bytes(count, value_bytes, start, length):
    """Bytes of a send of `count` elements covering [start, start + length)."""
    return (count + buckets(start, length)) * row_bytes(value_bytes)


def send_bytes(count, numel, value_bytes):
    """Bytes of a send of `count` elements of a range of `numel`, for the cost model: wire rows,
    or for 1-/2-bit codes (a value under a byte) a segment's offsets, counts and codes."""
    if value_bytes < 1:
        return count * row_bytes(value_bytes) + INDEX_BYTES * buckets(0, numel)
    return rows_bytes(count, value_bytes, 0, numel)


def scale_count(bits):
    """Scales per tensor of a quantized send (csrc/kernels/quantize.h): 1 bit, the means of
    the positive and negative values; 2 bits, of two magnitude classes per sign."""
    return 2 if bits == 1 else 4


def code_bytes(count, bits):
    return (count * bits + 7) // 8


@dataclass(frozen=True)
class Segment:
    """Byte offsets of one rank's quantized segment of a tensor of `numel` elements, relative
    to its start."""

    count: int
    n_scales: int
    bits: int
    numel: int

    @property
    def scales(self):
        return COUNT_BYTES

    @property
    def counts(self):
        return COUNT_BYTES + SCALE_BYTES * self.n_scales

    @property
    def offsets(self):
        return self.counts + INDEX_BYTES * buckets(0, self.numel)

    @property
    def codes(self):
        return self.offsets + INDEX_BYTES * self.count

    @property
    def size(self):
        """The segment's length, padded so the next rank's count stays 8-byte aligned."""
        end = self.codes + code_bytes(self.count, self.bits)
        return -(-end // COUNT_BYTES) * COUNT_BYTES
