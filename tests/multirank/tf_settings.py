"""Worker: ranks construct TF compressors with different settings; every rank must get the
same clear error on the first (traced) step, with no hang, and equal settings must train."""
import horovod.tensorflow as hvd
import tensorflow as tf

from sparsecomm.tensorflow import TopK

hvd.init()
for ratio in (0.1, 0.1 if hvd.rank() == 0 else 0.2):
    w = tf.Variable(tf.ones([64, 32]))
    compression = TopK(exchange="allgather", ratio=ratio, variables=[w])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * w)
        (grad,) = hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, [w])
        w.assign_sub(0.1 * grad)

    try:
        step()
        print(f"rank {hvd.rank()}: trained")
    except ValueError as error:
        print(f"rank {hvd.rank()}: ValueError: {error}")
