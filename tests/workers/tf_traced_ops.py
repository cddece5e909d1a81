"""Worker (one process, no horovodrun): traces a DistributedGradientTape step, Horovod's dense
allreduce and DGC, and prints one JSON line: whether autograph leaves Horovod's functions as
written here, and the op types of each step's graph, its functions' (tf.cond branches) included.
tests/compressors/test_tf_autograph.py runs it with Horovod converted and not."""

import collections
import json

import horovod.tensorflow as hvd
import tensorflow as tf
from tensorflow.python.autograph.impl import conversion

import sparsecomm.tensorflow as sctf


def traced_ops(make_compression):
    w = tf.Variable(tf.ones([64, 32]))
    compression = make_compression(w)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, w) ** 2)
        (grad,) = hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, [w])
        w.assign_sub(0.01 * grad)

    graph = step.get_concrete_function(tf.TensorSpec([8, 64])).graph.as_graph_def()
    ops = collections.Counter(node.op for node in graph.node)
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return dict(sorted(ops.items()))


hvd.init()
compressions = {
    "dense": lambda w: hvd.Compression.none,
    "dgc": lambda w: sctf.DGC(ratio=0.1, variables=[("w", w)], min_numel=0),
}
said = {"horovod_unconverted": conversion.is_allowlisted(hvd.allreduce)}
said.update({name: traced_ops(make) for name, make in compressions.items()})
print(json.dumps(said))
