"""How a packed gradient travels, for horovod.tensorflow: one sparsecomm.core.exchange.Exchange
per route, as in sparsecomm.torch.exchange, with the same phases: start(packed, wire) -> Started
in compress, finish(output, context) in decompress (no exchange here has a later phase: TF's
graph executor starts each collective as soon as its inputs are ready).

Two registries, by who carries the payload:
- CARRIED ("dense", "shared"): start hands Horovod's allreduce the payload itself;
- IN_GRAPH ("allgather", "spardl", "hierarchical", and "dense" for a stage of a schedule that
  goes dense, as DGC's warm-up may): the collectives run inside compress, and compress hands
  Horovod a placeholder (named after the variable): core.placement's marker, whose first
  element is 1.0 and whose reduction the graph checks. That element comes back as 1
  under op=Average and as the process set's size M under op=Sum, so `finish` adds the values
  at their indices scaled by output / M, in one op: the optimizer's semantics, without being
  told the op (as in torch).
"""

import re
from dataclasses import dataclass

import tensorflow as tf

from .. import host_sets, prerequisites
from ..core import cost, placement
from ..core.exchange import Exchange
from ..core.plan import SparDLLayout
from . import ops

# Horovod 0.28.1's TF collectives have no bfloat16. Summed bfloat16 values travel as float32
# (exact); gathered ones as their 2 bytes in the uint8 buffer of sparsecomm.core.wire.
_WIRE = {tf.bfloat16: tf.float32}


def horovod():
    """horovod.tensorflow, imported on first use with a clear error (sparsecomm.prerequisites)."""
    return prerequisites.horovod("tensorflow")


def collective_name(name, part):
    """A Horovod op name for one variable's collective: the same on every rank."""
    return "sparsecomm." + re.sub(r"[^A-Za-z0-9_.]", "_", name) + "." + part


def to_wire(tensor):
    return tf.cast(tensor, _WIRE[tensor.dtype]) if tensor.dtype in _WIRE else tensor


def wire_bytes(dtype):
    """Bytes per element of a summed tensor on the wire."""
    return tf.as_dtype(_WIRE.get(dtype, dtype)).size


def placeholder(name, process_set):
    """core.placement's marker of this rank over `process_set` (one element, 1.0, before
    hvd.init): its first element comes back as Horovod's op scaling."""
    hvd, name = horovod(), collective_name(name, "placeholder").replace(".", "_")
    if not hvd.is_initialized():
        return tf.ones([1], tf.float32, name=name)
    return tf.constant(placement.marker(hvd.rank(), process_set.ranks), tf.float32, name=name)


def checked_scale(output, owner, process_set, given):
    """Horovod's reduced placeholder as the op's scale (1 element), once one op has checked that
    Horovod reduced the markers over exactly `process_set` (core.placement; `given`: the
    compressor's process_set= argument). A failed check fails the step with InvalidArgumentError
    and core.placement's message. Every step: three floats."""
    if output.shape[0] == 1:  # (no marker: traced before hvd.init)
        return output
    ranks = process_set.ranks
    return ops.checked_scale(output, len(ranks), min(ranks), placement.refusal(owner, ranks, given))


@dataclass
class Wire:
    """One variable's exchange: its name, numel, shape and dtype, the process set and its number
    of ranks, and k."""

    name: str
    shape: tf.TensorShape
    dtype: tf.DType
    process_set: object
    ranks: int
    k: int = 0

    @property
    def numel(self):
        return self.shape.num_elements()


@dataclass
class Started:
    """What an exchange's start gives compress: the tensor for Horovod's allreduce (None: the
    exchange ran in the graph and compress hands a placeholder), finish's context, and this
    rank's counts (elements, bytes sent, bytes received; int64 tensors or ints)."""

    tensor: tf.Tensor | None
    context: object
    count: object
    sent: object
    received: object = 0


@dataclass
class Landed:
    """An in-graph exchange's context: every rank's values (in the gradient's dtype) and indices,
    in rank order, for decompress to add up; or, for a stage sent dense, the float32 sum itself
    (`dense`); the residual after the exchange; the variable's wire."""

    values: tf.Tensor | None
    index: tf.Tensor | None
    dense: tf.Tensor | None
    residual: tf.Tensor | None
    wire: Wire


class InGraph(Exchange):
    """An exchange that runs inside compress (start), finished in decompress."""

    def finish(self, scale, landed):
        """The result times `scale` / M, in the gradient's dtype and shape (`scale`: checked_scale's
        one element). Sparse (values and index): sparse_unpack reads the scale, so the zeroing, the
        adds and the scaling are one pass, as torch's. A dense stage's float32 sum: times the
        scale, rounded once (the same arithmetic). `dense` None: every stage is sparse; `values`
        None: every stage is dense; both given: the stage that ran says (a 0-element dense: sparse)."""
        values, index, dense, wire = landed.values, landed.index, landed.dense, landed.wire
        sparse = lambda: ops.sparse_unpack(values, index, wire.numel, scale, divisor=wire.ranks)  # noqa: E731
        summed = lambda: tf.cast(dense * (scale[0] / float(wire.ranks)), wire.dtype)  # noqa: E731
        if dense is None:
            flat = sparse()
        elif values is None:
            flat = summed()
        else:
            flat = tf.cond(tf.size(dense) > 0, summed, sparse)
        return tf.reshape(flat, wire.shape)


def _i64(x):
    return tf.cast(x, tf.int64)


class Dense(Exchange):
    """The whole tensor summed by Horovod's allreduce: start hands it the payload (bfloat16 as float32)."""

    def start(self, packed, wire):
        handed = to_wire(packed.values)
        size, ranks = wire.numel * handed.dtype.size, wire.ranks
        return Started(handed, wire.dtype, wire.numel, size, int(2 * (ranks - 1) / ranks * size))

    def finish(self, output, dtype):
        return output if output.dtype == dtype else tf.cast(output, dtype)


class Summed(InGraph):
    """The whole tensor summed inside compress: a stage of a schedule that goes dense (DGC's warm-up)."""

    def start(self, packed, wire):
        hvd = horovod()
        summed = hvd.allreduce(
            to_wire(packed.values), op=hvd.Sum, name=collective_name(wire.name, "dense"), process_set=wire.process_set
        )
        count = tf.constant(wire.numel, tf.int64)
        size = count * wire_bytes(wire.dtype)
        dense = tf.cast(tf.cast(summed, wire.dtype), tf.float32)
        return Started(
            None,
            Landed(None, None, dense, packed.residual, wire),
            count,
            size,
            tf.cast(2 * (wire.ranks - 1) * size // wire.ranks, tf.int64),
        )


class Shared(Exchange):
    """Shared coordinates: the packed values ride Horovod's allreduce (no indices)."""

    def start(self, packed, wire):
        count = tf.size(packed.values, out_type=tf.int64)
        size, ranks = count * wire_bytes(packed.values.dtype), wire.ranks
        # a ring allreduce receives 2 (N-1)/N of it
        return Started(to_wire(packed.values), (packed, wire), count, size, 2 * (ranks - 1) * size // ranks)

    def finish(self, output, context):
        packed, wire = context
        summed = to_value_dtype(output, wire.dtype)
        if packed.start is not None:
            flat = ops.block_unpack(summed, wire.numel, packed.start)
        else:
            flat = ops.sparse_unpack(summed, packed.index, wire.numel)
        return tf.reshape(flat, wire.shape)


class Allgather(InGraph):
    """Every rank's (index, value) rows, or its quantized segment (sparsecomm.core.wire), in ONE
    allgather; decompress adds all contributions, in rank order, in float32."""

    def start(self, packed, wire):
        quantized = packed.bits is not None
        buffer = _segment(packed, wire.numel) if quantized else _rows(packed.values, packed.index, 0, wire.numel)
        gathered = horovod().allgather(buffer, name=collective_name(wire.name, "gather"), process_set=wire.process_set)
        if quantized:
            values, index = _from_segments(gathered, packed.bits, wire.ranks, wire.numel)
        else:
            values, index = _from_rows(gathered, packed.values.dtype)
        values = tf.cast(values, wire.dtype)  # values may travel in 16 bits (or quantized)
        sent = tf.size(buffer, out_type=tf.int64)
        return Started(
            None,
            Landed(values, index, None, packed.residual, wire),
            tf.size(packed.index, out_type=tf.int64),
            sent,
            tf.size(gathered, out_type=tf.int64) - sent,
        )


def _rows(values, index, start, length):
    """The wire rows of sparsecomm.core.wire of a send of [start, start + length) (index int32,
    strictly ascending in it): uint8 [k + buckets, 2 + value bytes]. One op (the torch op's
    launcher): as graph ops, they dominated the tracing of every exchange."""
    return ops.wire_rows(values, index, start, length)


def _from_rows(rows, value_dtype):
    """(values, index int32) of wire rows (any sends one after another), the marker rows dropped:
    an element's index is the last marker's bucket times BUCKET plus its offset."""
    return ops.wire_columns(rows, value_dtype)


def _segment(packed, numel):
    """This rank's quantized segment of sparsecomm.core.wire (uint8, 1-D) of a tensor of `numel`:
    one op, the torch op's bytes."""
    return ops.quantized_segment(packed.codes, packed.scales, packed.index, packed.bits, numel)


def _from_segments(gathered, bits, ranks, numel):
    """Every rank's codes decoded with that rank's scales, in rank order, and the indices: one op
    whatever the number of ranks (each segment's count read where the op runs)."""
    return ops.segment_columns(gathered, bits, ranks, numel)


# --- SparDL: the torch exchange's twin (sparsecomm/torch/exchange.py explains it) ---------


def _keep_largest(values, index, k, residual):
    """(kept values, kept index, residual): the k of largest |value| (ties: lower index), in
    index order; the others are added to the residual (when given)."""
    kept_values, kept_index = ops.select_top(values, index, k)
    if residual is not None:
        position = tf.searchsorted(kept_index, index)
        found = tf.gather(kept_index, tf.minimum(position, tf.maximum(tf.size(kept_index) - 1, 0)))
        dropped = tf.logical_not((position < tf.size(kept_index)) & tf.equal(found, index))
        residual = tf.tensor_scatter_nd_add(
            residual, tf.expand_dims(tf.boolean_mask(index, dropped), 1), tf.boolean_mask(values, dropped)
        )
    return kept_values, kept_index, residual


_QUIET_NAN = {tf.bfloat16: 0x7FC0, tf.float16: 0x7E00}  # as sparsecomm.torch.exchange's: the kernels' NaN


def to_value_dtype(values, value_dtype):
    """float32 `values` in the value dtype, a NaN as the sign-kept quiet NaN of the kernels (TF's
    float16 cast keeps a NaN's payload)."""
    quiet = _QUIET_NAN.get(value_dtype)
    if quiet is None or values.dtype == value_dtype:
        return tf.cast(values, value_dtype)
    rounded = tf.cast(values, value_dtype)
    sign = tf.bitwise.bitwise_and(tf.bitwise.right_shift(tf.bitcast(values, tf.int32), 16), 0x8000)
    nan = tf.bitcast(tf.cast(tf.bitwise.bitwise_or(sign, quiet), tf.uint16), value_dtype)
    return tf.where(tf.math.is_nan(values), nan, rounded)


def _rounded(sums, index, value_dtype, residual):
    """(the owner's float32 sums in the value dtype, residual plus what rounding took off; a
    finite sum rounded to +-inf leaves nothing there)."""
    rounded = to_value_dtype(sums, value_dtype)
    if residual is not None and value_dtype != tf.float32:
        error = sums - tf.cast(rounded, tf.float32)
        error = tf.where(tf.math.is_finite(error), error, tf.zeros_like(error))
        residual = tf.tensor_scatter_nd_add(residual, tf.expand_dims(index, 1), error)
    return rounded, residual


@dataclass
class _Reduced:
    """SparDL's reduce-scatter on one rank: the reduced rows of the block it owns (`final`), the
    residual after it, and its counts so far (int64 tensors)."""

    final: tf.Tensor
    residual: tf.Tensor | None
    value_dtype: tf.DType
    sent_pairs: tf.Tensor
    sent: tf.Tensor
    received: tf.Tensor

    def started(self, gathered, wire, relayed=None):
        """What start gives once `gathered` (every owner's rows) arrived; `relayed`: rows this rank
        passed on besides its own (the hierarchical exchange's hosts' rows)."""
        values, index = _from_rows(gathered, self.value_dtype)
        values = tf.cast(values, wire.dtype)  # as the allgather exchange
        sent = self.sent + tf.size(self.final, out_type=tf.int64)
        if relayed is not None:
            sent += tf.size(relayed, out_type=tf.int64)
        received = self.received + tf.size(gathered, out_type=tf.int64) - tf.size(self.final, out_type=tf.int64)
        return Started(None, Landed(values, index, None, self.residual, wire), self.sent_pairs, sent, received)


class SparDL(InGraph):
    """Sparse reduce-scatter (one alltoall to the block owners) + sparse all-gather, in the graph."""

    def start(self, packed, wire):
        reduced = self.reduce_scatter(packed, wire, wire.process_set)
        gathered = horovod().allgather(
            reduced.final, name=collective_name(wire.name, "gather"), process_set=wire.process_set
        )
        return reduced.started(gathered, wire)

    def reduce_scatter(self, packed, wire, process_set):
        """Phase 1 and the owner's reduction over `process_set`, one block per rank of it."""
        layout, rank = SparDLLayout.of(wire.numel, wire.k, process_set.size()), process_set.rank()
        value_dtype = packed.values.dtype
        payload, splits, own, residual, sent_pairs = self._scatter_rows(packed, layout, rank)
        received, received_splits = horovod().alltoall(
            payload, splits=tf.stack(splits), name=collective_name(wire.name, "scatter"), process_set=process_set
        )
        parts = tf.split(received, received_splits, num=layout.ranks)
        parts[rank] = own
        values, index = _from_rows(tf.concat(parts, 0), value_dtype)
        low, size = layout.owned(rank)
        sums = ops.sparse_unpack(tf.cast(values, tf.float32), index - low, size)  # float32, added in rank order
        owned = tf.sort(tf.unique(index)[0])
        reduced, owned, residual = _keep_largest(tf.gather(sums, owned - low), owned, layout.per_rank, residual)
        reduced, residual = _rounded(reduced, owned, value_dtype, residual)
        final = _rows(reduced, owned, low, size)
        return _Reduced(
            final,
            residual,
            value_dtype,
            _i64(sent_pairs + tf.size(owned)),
            tf.size(payload, out_type=tf.int64),
            tf.size(received, out_type=tf.int64),
        )

    @staticmethod
    def _scatter_rows(packed, layout, rank):
        """Each other block's at most per_rank largest pairs as rows (the rest to the residual),
        the rows of this rank's own block, and the pairs sent."""
        values, index, residual = tf.cast(packed.values, tf.float32), packed.index, packed.residual
        bounds = tf.searchsorted(index, tf.constant(layout.bounds(), tf.int32))
        rows, splits, own, pairs = [], [], None, tf.constant(0, tf.int32)
        for b in range(layout.ranks):
            v, i = values[bounds[b] : bounds[b + 1]], index[bounds[b] : bounds[b + 1]]
            if b == rank:
                own = _rows(packed.values[bounds[b] : bounds[b + 1]], i, *layout.owned(b))
                splits.append(tf.constant(0, tf.int32))
                continue
            v, i, residual = _keep_largest(v, i, layout.per_rank, residual)
            rows.append(_rows(to_value_dtype(v, packed.values.dtype), i, *layout.owned(b)))
            splits.append(tf.shape(rows[-1])[0])
            pairs += tf.size(i)
        empty = _rows(packed.values[:0], index[:0], 0, 0)
        return (tf.concat(rows, 0) if rows else empty), splits, own, residual, pairs


class Hierarchical(InGraph):
    """sparsecomm.torch.exchange.Hierarchical's twin: SparDL's reduce-scatter over the host's
    ranks, each rank's reduced block all-gathered across the hosts (its cross set), then the
    hosts' rows all-gathered inside the host."""

    def start(self, packed, wire):
        hvd = horovod()
        local, cross = host_sets.registered(hvd, wire.ranks)
        reduced = SparDL().reduce_scatter(packed, wire, local)
        across = hvd.allgather(reduced.final, name=collective_name(wire.name, "cross"), process_set=cross)
        gathered = hvd.allgather(across, name=collective_name(wire.name, "host"), process_set=local)
        return reduced.started(gathered, wire, relayed=across)


CARRIED = {"dense": Dense(), "shared": Shared()}
IN_GRAPH = {"dense": Summed(), "allgather": Allgather(), "spardl": SparDL(), "hierarchical": Hierarchical()}


def allgather_ints(ints, name, process_set):
    """Every rank's `ints`, concatenated in rank order: one allgather, run eagerly even inside a trace."""
    with tf.init_scope():
        tensor = horovod().allgather(tf.constant(ints, tf.int64), name=name, process_set=process_set)
        return tensor.numpy().tolist()


def measure_network(process_set):
    """sparsecomm.torch.calibration.measure_network with horovod.tensorflow (eager), and where the
    hosts' process sets are registered (host_sets.measurable on every rank) the hosts, their link
    timed over this rank's host set: (Network, None, None, cost.Hosts or None), as the core's
    _measure_network returns (TF measures no local cost and watches no backward), averaged over
    the ranks."""

    hvd, ranks = horovod(), process_set.size()
    found = host_sets.measurable(hvd, ranks)
    flags = hvd.allgather(
        tf.constant([int(found is not None)], tf.int32), name="sparsecomm.measure.hosts", process_set=process_set
    )
    found = found if bool(tf.reduce_all(flags > 0)) else None
    inside = _network_timings(hvd, found[1], "sparsecomm.measure.host") if found else []
    timings = _network_timings(hvd, process_set) + inside
    mean = hvd.allreduce(
        tf.constant(timings, tf.float64), op=hvd.Average, name="sparsecomm.measure.mean", process_set=process_set
    ).numpy()
    network = _fitted_network(ranks, mean[:3])
    if not found:
        return network, None, None, None
    layout = found[0]
    return network, None, None, cost.Hosts(layout.hosts, layout.per_host, _fitted_network(layout.per_host, mean[3:]))


def _network_timings(hvd, process_set, name="sparsecomm.measure"):
    """Seconds of a 1-element allreduce, of a 4 MB one and of a local copy of 4 MB over `process_set`
    (collectives named `name`.N)."""

    small, big = tf.zeros([1]), tf.zeros([1 << 20])
    counter = iter(range(1 << 30))

    def reduce(t):
        return hvd.allreduce(t, name=f"{name}.{next(counter)}", process_set=process_set).numpy()

    reduce(small)
    t_small, t_big = cost.median_seconds(lambda: reduce(small), 5), cost.median_seconds(lambda: reduce(big), 3)
    return [t_small, t_big, cost.median_seconds(lambda: tf.identity(big + 0.0).numpy(), 3)]


def _fitted_network(ranks, timings):

    latency, bandwidth, copy_bandwidth = cost.from_timings(ranks, *map(float, timings[:2]), 1 << 22, float(timings[2]))
    return cost.Network(bandwidth=bandwidth, latency=latency, copy_bandwidth=copy_bandwidth)
