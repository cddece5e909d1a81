"""Worker (2 ranks): ranks construct TF compressors with different settings, or restore checkpoints
of different steps before the step is traced (on every rank, or on one only); every rank must
get the same clear error on the first (traced) step, with no hang, and equal settings must train.
Then each rank's compressor runs over the rank alone under a tape over both, and the tape reduces
with op=hvd.Min: the graph's check of the reduced placeholder (core.placement) must refuse both."""

import os
import tempfile

import horovod.tensorflow as hvd
import tensorflow as tf

from sparsecomm.tensorflow import RandomBlock, TopK

alone = [hvd.ProcessSet([0]), hvd.ProcessSet([1])]  # each rank's set of itself
hvd.init(process_sets=alone)


def stepper(w, compression, op=hvd.Average):
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * w)
        tape = hvd.DistributedGradientTape(tape, compression=compression, op=op)
        (grad,) = tape.gradient(loss, [w])
        w.assign_sub(0.1 * grad)

    return step


def attempt(case, step):
    try:
        step()
        print(f"rank {hvd.rank()}: {case}trained")
    except ValueError as error:
        print(f"rank {hvd.rank()}: {case}ValueError: {error}")
    except tf.errors.InvalidArgumentError as error:  # a check in the graph
        said = [line for line in error.message.splitlines() if "sparsecomm" not in line and ": " in line]
        print(f"rank {hvd.rank()}: {case}InvalidArgumentError: {said[0] if said else error.message}")


for ratio in (0.1, 0.1 if hvd.rank() == 0 else 0.2):
    w = tf.Variable(tf.ones([64, 32]))
    attempt("", stepper(w, TopK(exchange="allgather", ratio=ratio, variables=[w])))

# Checkpoints of RandomBlock at steps 1 and 3 (each rank its own), restored into a fresh model.
folder = tempfile.mkdtemp()
w = tf.Variable(tf.ones([64, 32]))
compression = RandomBlock(ratio=0.05, seed=7, variables=[("w", w)], min_numel=0)
checkpoint, step = tf.train.Checkpoint(w=w, compression=compression), stepper(w, compression)
saved = {}
for number in range(1, 4):
    step()
    saved[number] = checkpoint.write(os.path.join(folder, f"step{number}"))
for case, restored in (("different steps: ", 1 if hvd.rank() == 0 else 3), ("one rank: ", 3 if hvd.rank() else None)):
    w = tf.Variable(tf.ones([64, 32]))
    compression = RandomBlock(ratio=0.05, seed=7, variables=[("w", w)], min_numel=0)
    if restored is not None:
        tf.train.Checkpoint(w=w, compression=compression).read(saved[restored]).assert_consumed()
    attempt(case, stepper(w, compression))

# The graph's check of the reduced placeholder (core.placement): each rank's compressor over the
# rank alone under a tape over both (each would average alone), and an op that is neither Sum
# nor Average.
w = tf.Variable(tf.ones([64, 32]))
attempt(
    "compressor alone: ",
    stepper(w, TopK(exchange="allgather", ratio=0.1, variables=[w], process_set=alone[hvd.rank()])),
)
w = tf.Variable(tf.ones([64, 32]))
attempt("op Min: ", stepper(w, TopK(exchange="allgather", ratio=0.1, variables=[w]), op=hvd.Min))
# Horovod shuts every rank down as soon as one finishes: a rank still running a collective
# would see its process set gone. All ranks meet here.
hvd.allreduce(tf.zeros([1]), name="done")
