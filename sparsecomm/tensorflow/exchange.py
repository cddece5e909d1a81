"""Exchanges of the TF compressors, with Horovod's public TF ops, inside compress.

In TF the graph executor runs every collective as soon as its inputs are ready, so the
per-rank-coordinate methods gather inside `compress` and hand Horovod's allreduce a
1-element placeholder holding 1.0 (named after the variable). It comes back as 1 under
op=Average and as the process set's size M under op=Sum, so decompress scales the gathered
sum by output / M: the optimizer's semantics, without being told the op (as in torch).
"""
import re

import tensorflow as tf

from . import ops

# Horovod 0.28.1's TF collectives have no bfloat16. Summed bfloat16 values travel as float32
# (exact); gathered ones as their bits in a float16 tensor (no arithmetic: same bytes).
_WIRE = {tf.bfloat16: tf.float32}


def _hvd():
    import horovod.tensorflow as hvd  # imported on first use: the ops work without Horovod
    return hvd


def collective_name(name, part):
    """A Horovod op name for one variable's collective: the same on every rank."""
    return "sparsecomm." + re.sub(r"[^A-Za-z0-9_.]", "_", name) + "." + part


def to_wire(tensor):
    return tf.cast(tensor, _WIRE[tensor.dtype]) if tensor.dtype in _WIRE else tensor


def wire_bytes(dtype):
    """Bytes per element of a summed tensor on the wire."""
    return tf.as_dtype(_WIRE.get(dtype, dtype)).size


def placeholder(name):
    return tf.ones([1], tf.float32, name=collective_name(name, "placeholder").replace(".", "_"))


def allgather_sum(values, index, numel, dtype, name, process_set):
    """(Sum over the process set's ranks of each rank's values at its indices, as a float32
    dense tensor of `numel` elements; bytes received). Values are cast to the gradient's dtype first (they may
    travel in 16 bits), as the torch exchange does."""
    hvd = _hvd()
    bits16 = values.dtype == tf.bfloat16
    wire = tf.bitcast(values, tf.float16) if bits16 else values
    gathered = hvd.allgather(wire, name=collective_name(name, "values"), process_set=process_set)
    index = hvd.allgather(index, name=collective_name(name, "index"), process_set=process_set)
    gathered = tf.bitcast(gathered, tf.bfloat16) if bits16 else gathered
    received = tf.cast(tf.size(index) - tf.size(values), tf.int64) * (values.dtype.size + 4)
    gathered = tf.cast(tf.cast(gathered, dtype), tf.float32)
    return ops.sparse_unpack(gathered, index, numel), received


def allgather_sum_quantized(codes, scales, index, bits, numel, dtype, name, process_set):
    """allgather_sum for 1-/2-bit values: every rank's codes are decoded with its scales."""
    hvd = _hvd()
    gather = lambda t, part: hvd.allgather(t, name=collective_name(name, part), process_set=process_set)  # noqa: E731
    count = tf.reshape(tf.cast(tf.size(index), tf.int64), [1])
    codes, scales, index, counts = (gather(codes, "codes"), gather(scales, "scales"), gather(index, "index"),
                                    gather(count, "count"))
    ranks = process_set.size()
    per_rank = scales.shape[0] // ranks if scales.shape[0] is not None else tf.size(scales) // ranks
    sizes = (counts * bits + 7) // 8
    ends = tf.cumsum(sizes)
    values = []
    for rank in range(ranks):
        begin = ends[rank] - sizes[rank]
        values.append(ops.dequantize(codes[begin:ends[rank]], scales[rank * per_rank:(rank + 1) * per_rank],
                                     counts[rank], bits))
    decoded = tf.cast(tf.cast(tf.concat(values, 0), dtype), tf.float32)
    return ops.sparse_unpack(decoded, index, numel)


def allreduce_sum(tensor, name, process_set):
    """Dense sum over the process set (inside compress, for a warm-up stage that goes dense)."""
    hvd = _hvd()
    summed = hvd.allreduce(to_wire(tensor), op=hvd.Sum, name=collective_name(name, "dense"), process_set=process_set)
    return tf.cast(tf.cast(summed, tensor.dtype), tf.float32)


def finish(output, summed, shape, dtype, ranks):
    """decompress: the gathered float32 sum scaled by output / M, in the gradient's dtype.
    (Sum, then one multiplication, then one rounding: the torch sparse_unpack's arithmetic.)"""
    scale = tf.reshape(output, [-1])[0] / float(ranks)
    return tf.reshape(tf.cast(summed * scale, dtype), shape)


# --- SparDL: the torch exchange's mirror (sparsecomm/torch/exchange.py explains it) --------

def _pairs(values, index):
    return tf.stack([tf.bitcast(tf.cast(values, tf.float32), tf.int32), index], 1)


def _unpair(rows):
    rows = tf.reshape(rows, [-1, 2])
    return tf.bitcast(rows[:, 0], tf.float32), rows[:, 1]


def _keep_largest(values, index, k, residual):
    """(kept values, kept index, residual): the k of largest |value| (ties: lower index), in
    index order; the others are added to the residual (when given)."""
    kept_values, kept_index = ops.select_top(values, index, k)
    if residual is not None:
        position = tf.searchsorted(kept_index, index)
        found = tf.gather(kept_index, tf.minimum(position, tf.maximum(tf.size(kept_index) - 1, 0)))
        dropped = tf.logical_not((position < tf.size(kept_index)) & tf.equal(found, index))
        residual = tf.tensor_scatter_nd_add(residual, tf.expand_dims(tf.boolean_mask(index, dropped), 1),
                                            tf.boolean_mask(values, dropped))
    return kept_values, kept_index, residual


def spardl_sum(values, index, residual, k, numel, name, process_set):
    """The SparDL exchange of one tensor, in the graph: (float32 sum over the ranks, the
    residual with this rank's dropped values added, pairs sent, bytes sent, bytes received)."""
    hvd = _hvd()
    ranks, rank = process_set.size(), process_set.rank()
    block, per_rank = -(-numel // ranks), max(1, -(-k // ranks))
    values = tf.cast(values, tf.float32)
    bounds = tf.searchsorted(index, tf.constant([min(b * block, 2**31 - 1) for b in range(ranks + 1)], tf.int32))
    rows, splits = [], []
    for b in range(ranks):
        v, i = values[bounds[b]:bounds[b + 1]], index[bounds[b]:bounds[b + 1]]
        if b == rank:
            own = (v, i)
            splits.append(tf.constant(0, tf.int32))
            continue
        v, i, residual = _keep_largest(v, i, per_rank, residual)
        rows.append(_pairs(v, i))
        splits.append(tf.size(i))
    payload = tf.concat(rows, 0) if rows else tf.zeros([0, 2], tf.int32)
    received, received_splits = hvd.alltoall(payload, splits=tf.stack(splits), name=collective_name(name, "scatter"),
                                             process_set=process_set)
    parts = tf.split(tf.reshape(received, [-1, 2]), received_splits, num=ranks)
    parts[rank] = _pairs(*own)
    values, index = _unpair(tf.concat(parts, 0))
    low = rank * block
    size = max(0, min(block, numel - low))
    sums = ops.sparse_unpack(values, index - low, size)  # float32, added in rank order
    owned = tf.sort(tf.unique(index)[0])
    reduced, owned, residual = _keep_largest(tf.gather(sums, owned - low), owned, per_rank, residual)
    final = _pairs(reduced, owned)
    gathered = hvd.allgather(final, name=collective_name(name, "gather"), process_set=process_set)
    values, index = _unpair(gathered)
    sent_pairs = tf.cast(tf.shape(payload)[0] + tf.shape(final)[0], tf.int64)
    received_pairs = tf.cast(tf.shape(received)[0] + tf.shape(gathered)[0] - tf.shape(final)[0], tf.int64)
    return ops.sparse_unpack(values, index, numel), residual, sent_pairs, 8 * sent_pairs, 8 * received_pairs


def measure_network(process_set):
    """sparsecomm.torch.exchange.measure_network with horovod.tensorflow (eager)."""
    from .. import _cost
    hvd = _hvd()
    ranks = process_set.size()

    small, big = tf.zeros([1]), tf.zeros([1 << 20])
    counter = iter(range(1 << 30))
    reduce = lambda t: hvd.allreduce(t, name=f"sparsecomm.measure.{next(counter)}", process_set=process_set).numpy()  # noqa: E731
    reduce(small)
    t_small, t_big = _cost.median_seconds(lambda: reduce(small), 5), _cost.median_seconds(lambda: reduce(big), 3)
    t_copy = _cost.median_seconds(lambda: tf.identity(big + 0.0).numpy(), 3)
    measured = _cost.from_timings(ranks, t_small, t_big, 1 << 22, t_copy)
    mean = hvd.allreduce(tf.constant(measured, tf.float64), op=hvd.Average, name="sparsecomm.measure.mean",
                         process_set=process_set).numpy()
    return _cost.Network(bandwidth=float(mean[1]), latency=float(mean[0]), copy_bandwidth=float(mean[2]))
