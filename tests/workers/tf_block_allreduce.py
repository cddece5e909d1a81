"""Worker: Horovod + TensorFlow + sparsecomm's TF op library together. Inside a tf.function,
each rank error-feedback packs the shared-seed random block of its gradient with the op
library, hvd.allreduce sums the packed values, and the op library unpacks them. Also one
DistributedGradientTape step of a small model, to show the TF training path runs. --sizes:
each size in turn on the first N ranks (common.sizes_of)."""

import os

import common
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from sparsecomm.core import selection
from sparsecomm.tensorflow import ops

args = common.add_sizes_argument(common.worker_parser(steps=4)).parse_args()
SETS = common.sizes_of(hvd, args.sizes)

SEED, RATIO = 5, 0.2
TENSORS = {"w_f32": ([1000], tf.float32), "w_f16": ([257], tf.float16), "w_bf16": ([33, 5], tf.bfloat16)}
x_all, y_all = common.digits()


def gradient(name, step, rank):
    """Rank- and step-specific gradient, reproducible by the reference."""
    shape, dtype = TENSORS[name]
    rng = np.random.default_rng([step, rank, selection.tensor_id(name)])
    return tf.cast(rng.standard_normal(shape).astype(np.float32), dtype)


def block_exchange(on):
    """The step of one tensor, over the process set that `on` gives (common.set_arguments)."""

    @tf.function(autograph=False)  # docs/testing.md, "TF workers"
    def exchange(grad, residual, step, name, numel, length):
        start = ops.random_block_start(SEED, selection.tensor_id(name), step, numel)
        values, residual_out = ops.block_pack(grad, residual.read_value(), start, length)
        residual.assign(residual_out)
        # Horovod 0.28.1's TF allreduce has no bfloat16: such values travel as float32.
        wire = tf.cast(values, tf.float32) if values.dtype == tf.bfloat16 else values
        summed = tf.cast(hvd.allreduce(wire, op=hvd.Sum, name=f"block.{name}", **on), values.dtype)
        return ops.block_unpack(summed, numel, start)

    return exchange


def tape_step(on, out, rank, size):
    """One DistributedGradientTape step (dense compression) of a linear model on digits."""
    idx = common.rows(0, rank, size, len(y_all))
    w = tf.Variable(tf.zeros([64, 10]))

    @tf.function(autograph=False)  # docs/testing.md, "TF workers"
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x @ w))
        tape = hvd.DistributedGradientTape(tape, **on)
        (grad,) = tape.gradient(loss, [w])
        w.assign_sub(0.5 * grad)

    train_step(tf.constant(x_all[idx]), tf.constant(y_all[idx]))
    out["tape/w"] = w.numpy()


def run(size, process_set):
    """The block exchange and the tape step on the ranks of `process_set`, saved in the folder of `size`."""
    on, out, rank = common.set_arguments(hvd, process_set), {}, process_set.rank()
    exchange = block_exchange(on)
    residuals = {name: tf.Variable(tf.zeros([int(np.prod(shape))])) for name, (shape, _) in TENSORS.items()}
    for step in range(args.steps):
        for name, (shape, _dtype) in TENSORS.items():
            numel = int(np.prod(shape))
            dense = exchange(
                gradient(name, step, rank),
                residuals[name],
                tf.constant(step, tf.int64),
                name,
                numel,
                selection.selected_count(RATIO, numel),
            )
            out[f"{name}/dense/{step}"] = tf.cast(dense, tf.float32).numpy()
            out[f"{name}/residual/{step}"] = residuals[name].numpy()
    tape_step(on, out, rank, size)
    np.savez(os.path.join(common.size_folder(args.out, size), f"rank{rank}.npz"), **out)
    print(f"rank {rank}/{size}: done")


common.for_each_size(hvd, SETS, run, tf.zeros(1))
