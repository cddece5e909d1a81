"""Worker: rank 1 dies in the backward pass of step --die-at (after the output layer's
gradients were compressed and their exchange started, before the first layer's), while the
other ranks train on. The digits MLP with TopK(exchange=--exchange) under
hvd.DistributedOptimizer (torch) or hvd.DistributedGradientTape in tf.function (tf). The job
must end, non-zero, without any rank printing "trained".

--how exit: os._exit(3); --how kill: SIGKILL (as the kernel's OOM killer would)."""

import argparse
import os
import signal
import time

import common
import numpy as np
from common import EVERY

parser = argparse.ArgumentParser()
parser.add_argument("--framework", choices=["torch", "tf"], required=True)
parser.add_argument("--exchange", choices=["allgather", "spardl"], required=True)
parser.add_argument("--how", choices=["exit", "kill"], default="exit")
parser.add_argument("--die-at", type=int, default=5)
parser.add_argument("--steps", type=int, default=500)
args = parser.parse_args()
x_all, y_all = common.digits()
now = {"step": 0}


def maybe_die():
    """Called in the backward pass of the first layer's weight: rank 1 dies at step --die-at."""
    if rank == 1 and now["step"] == args.die_at:
        print(f"rank 1: dying at step {args.die_at}, time {time.time():.3f}", flush=True)
        if args.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(3)
    return 0


def torch_training():
    import torch

    from sparsecomm.torch import TopK

    model = common.torch_model()

    def hook(grad):  # runs before the first layer's weight gradient is compressed
        maybe_die()

    model[0].weight.register_hook(hook)
    compression = TopK(ratio=0.1, exchange=args.exchange, named_parameters=model.named_parameters(), **EVERY)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(), compression=compression
    )

    def step(x, y):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()

    return step


def tf_training():
    import tensorflow as tf

    from sparsecomm.tensorflow import TopK

    rng = np.random.default_rng(0)
    w0, b0, w2, b2 = variables = [
        tf.Variable(rng.uniform(-0.2, 0.2, shape).astype(np.float32)) for shape in ((64, 32), (32,), (32, 10), (10,))
    ]
    compression = TopK(ratio=0.1, exchange=args.exchange, variables=variables, **EVERY)

    @tf.custom_gradient
    def watched(x):  # the identity, whose gradient first calls maybe_die
        def grad(dy):
            with tf.control_dependencies([tf.py_function(maybe_die, [], tf.int32)]):
                return tf.identity(dy)

        return tf.identity(x), grad

    @tf.function(autograph=False)  # docs/testing.md, "TF workers"
    def step(x, y):
        with tf.GradientTape() as tape:
            hidden = tf.nn.relu(x @ watched(w0) + b0)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=hidden @ w2 + b2))
        grads = hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(0.1 * g)

    return step


if args.framework == "torch":
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
else:
    import horovod.tensorflow as hvd
hvd.init()
rank = hvd.rank()
train_step = torch_training() if args.framework == "torch" else tf_training()
print(f"rank {rank}: training", flush=True)
for now["step"] in range(args.steps):
    idx = common.rows(now["step"], rank, hvd.size(), len(y_all))
    train_step(x_all[idx], y_all[idx])
print(f"rank {rank}: trained {args.steps} steps", flush=True)
