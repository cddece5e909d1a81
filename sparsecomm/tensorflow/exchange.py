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
    """Sum over the process set's ranks of each rank's values at its indices, as a float32
    dense tensor of `numel` elements. Values are cast to the gradient's dtype first (they may
    travel in 16 bits), as the torch exchange does."""
    hvd = _hvd()
    bits16 = values.dtype == tf.bfloat16
    wire = tf.bitcast(values, tf.float16) if bits16 else values
    gathered = hvd.allgather(wire, name=collective_name(name, "values"), process_set=process_set)
    index = hvd.allgather(index, name=collective_name(name, "index"), process_set=process_set)
    gathered = tf.bitcast(gathered, tf.bfloat16) if bits16 else gathered
    gathered = tf.cast(tf.cast(gathered, dtype), tf.float32)
    return ops.sparse_unpack(gathered, index, numel)


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
