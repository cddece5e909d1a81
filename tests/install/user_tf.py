"""A user's 2-rank TensorFlow script, as the README writes it: DGC through stock
hvd.DistributedGradientTape in a tf.function, run in a fresh environment with TensorFlow and no
torch, where sparsecomm was installed from its sdist. Prints "in sync" when every rank ends with
bitwise equal variables, the loss went down and fewer bytes went out than dense."""

import sys

import horovod.tensorflow as hvd
import tensorflow as tf

import sparsecomm
import sparsecomm.tensorflow as sctf

assert "torch" not in sys.modules, "a TF-only user's process imported torch"
hvd.init()
tf.random.set_seed(0)
w, b = tf.Variable(tf.random.normal([256, 10], stddev=0.1)), tf.Variable(tf.zeros([10]))
hvd.broadcast_variables([w, b], root_rank=0)
compression = sctf.DGC(ratio=0.01, momentum=0.9, exchange="allgather", variables=[w, b])  # auto: dense here


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x @ w + b))
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    for variable, grad in zip([w, b], tape.gradient(loss, [w, b])):
        variable.assign_sub(0.5 * grad)  # plain SGD: the momentum is DGC's
    return loss


x = tf.random.stateless_normal([512, 256], seed=[1, 2])
y = tf.argmax(x @ tf.random.stateless_normal([256, 10], seed=[3, 4]), axis=1, output_type=tf.int32)
before = float(train_step(x[:16], y[:16]))
for step in range(1, 30):
    first = (step * hvd.size() + hvd.rank()) * 16 % 512
    after = float(train_step(x[first : first + 16], y[first : first + 16]))
full = float(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x @ w + b)))
everyone = hvd.allgather(tf.reshape(tf.concat([tf.reshape(w, [-1]), b], 0), [1, -1]), name="user.variables")
stats = compression.stats()
assert all(bool(tf.reduce_all(everyone[0] == row)) for row in everyone[1:]), "ranks differ"
assert full < before, f"loss {before} -> {full}"
assert stats["sent_bytes"] < stats["dense_bytes"], stats
print(
    f"rank {hvd.rank()}: sparsecomm {sparsecomm.__version__} from {sparsecomm.__file__}: in sync, "
    f"loss {before:.3f} -> {full:.3f}, sent {stats['sent_bytes']} of {stats['dense_bytes']} dense bytes",
    flush=True,
)
