"""Worker: tf.train.Checkpoint -> restore -> continue equals not stopping, with
DistributedGradientTape in tf.function. Each config trains 5 steps straight; then 3 steps,
saves the model and the compressor (each rank its own checkpoint: residuals differ per rank),
builds everything anew, restores, and trains 2 more. Saves both final parameter sets. The
compressors are bound to the plain list of unnamed variables (TF names each "Variable")."""

import os

import common
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import EVERY

from sparsecomm.tensorflow import DGC, RandomBlock, Threshold

args = common.worker_parser().parse_args()
hvd.init()
x_all, y_all = common.digits()
CONFIGS = {
    "dgc": lambda v: DGC(
        exchange="allgather", ratio=0.1, momentum=0.9, warmup_steps=4, warmup_stages=2, variables=v, **EVERY
    ),
    "random_block": lambda v: RandomBlock(ratio=0.1, seed=5, variables=v, **EVERY),
    "threshold_2bit": lambda v: Threshold(exchange="allgather", ratio=0.1, quantize="2bit", variables=v, **EVERY),
}


def build(make_compression):
    rng = np.random.default_rng(0)
    variables = [
        tf.Variable(rng.uniform(-0.2, 0.2, shape).astype(np.float32)) for shape in ((64, 32), (32,), (32, 10), (10,))
    ]
    compression = make_compression(variables)  # all four unnamed ("Variable"): state goes by position

    @tf.function(autograph=False)  # docs/testing.md, "TF workers"
    def step(x, y):
        with tf.GradientTape() as tape:
            hidden = tf.nn.relu(x @ variables[0] + variables[1])
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=hidden @ variables[2] + variables[3])
            )
        grads = hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(0.5 * g)

    return variables, compression, step


def train(step_fn, steps):
    for step in steps:
        idx = common.rows(step, hvd.rank(), hvd.size(), len(y_all))
        step_fn(tf.constant(x_all[idx]), tf.constant(y_all[idx]))


out = {}
for config, make_compression in CONFIGS.items():
    variables, _, step_fn = build(make_compression)
    train(step_fn, range(5))
    for i, v in enumerate(variables):
        out[f"{config}/straight/{i}"] = v.numpy()

    variables, compression, step_fn = build(make_compression)
    train(step_fn, range(3))
    path = tf.train.Checkpoint(variables=variables, compression=compression).save(
        os.path.join(args.out, f"ckpt_{config}_rank{hvd.rank()}", "ckpt")
    )
    variables, compression, step_fn = build(make_compression)  # a fresh start, as after a restart
    tf.train.Checkpoint(variables=variables, compression=compression).restore(path).assert_consumed()
    train(step_fn, range(3, 5))
    for i, v in enumerate(variables):
        out[f"{config}/resumed/{i}"] = v.numpy()
    out[f"{config}/steps"] = np.array([int(s.step.numpy()) for s in compression.state])
np.savez(os.path.join(args.out, f"rank{hvd.rank()}.npz"), **out)
print(f"rank {hvd.rank()}: done")
