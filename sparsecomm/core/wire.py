"""What one rank puts on the wire for a gathered tensor: ONE buffer per tensor and step, so
one allgather carries it (not one per part). Written once here; the TF exchange builds and
reads it with views and bitcasts, torch with the ops wire_rows, wire_columns and
sparse_unpack_rows (csrc/torch/select.h), quantized_segment and sparse_unpack_segments
(csrc/torch/quantize.h, whose QuantizedSegment mirrors Segment below): the same views and
copies, one op each instead of a handful of Python-level torch calls per tensor. No
arithmetic: the same bytes on every framework (tests/ops/test_torch_wire_ops.py checks torch's
against rows and segments built in numpy).

Values and indices (exchange="allgather"): uint8 rows of ``4 + value_bytes``, one row per
sent element: its int32 index, then its value's bytes (the gradient's dtype, or the method's
value_dtype), as in memory. The gathered rows of all ranks, in rank order, are split back
into indices and values by column (the index first keeps both columns aligned for their
dtypes, whatever the value size).

1-/2-bit codes: one uint8 segment per rank, its parts aligned for their dtypes:

    count   int64, 8 bytes       how many elements this rank sent
    scales  float32 x n_scales   the per-tensor class means (core.methods: 2 for 1 bit, 4 for 2)
    index   int32 x count
    codes   ceil(count * bits / 8) bytes, then zero padding to a multiple of 8 bytes

The segments' lengths differ per rank (count), so the reader walks them in rank order.
"""

from dataclasses import dataclass

INDEX_BYTES = 4  # indices travel as int32,
# so a tensor sent with indices has at most this many elements (core.plan.Planner.check_indexable)
MAX_INDEXED_NUMEL = 2**31 - 1
COUNT_BYTES = 8
SCALE_BYTES = 4


def scale_count(bits):
    """Scales per tensor of a quantized send (csrc/kernels/quantize.h): 1 bit, the means of
    the positive and negative values; 2 bits, of two magnitude classes per sign."""
    return 2 if bits == 1 else 4


def code_bytes(count, bits):
    return (count * bits + 7) // 8


@dataclass(frozen=True)
class Segment:
    """Byte offsets of one rank's quantized segment, relative to its start."""

    count: int
    n_scales: int
    bits: int

    @property
    def scales(self):
        return COUNT_BYTES

    @property
    def index(self):
        return COUNT_BYTES + SCALE_BYTES * self.n_scales

    @property
    def codes(self):
        return self.index + INDEX_BYTES * self.count

    @property
    def size(self):
        """The segment's length, padded so the next rank's count stays 8-byte aligned."""
        end = self.codes + code_bytes(self.count, self.bits)
        return -(-end // COUNT_BYTES) * COUNT_BYTES
