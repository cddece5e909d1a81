"""Worker: a few SGD steps of a small MLP on digits with hvd.DistributedGradientTape inside
tf.function (and, for some configs, eager and hvd.allreduce), for each sparsecomm.tensorflow
compressor, bound to (name, variable) pairs and (the "plain_" configs) to the plain list of
the model's unnamed variables. Saves every rank's local gradients (before the exchange) and parameters after
every step, so the test can replay the exchange with a plain reference, bit for bit.

The batch size alternates between two values, so every config runs two traces of its step
(retracing) and the compressor state must carry across them."""

import argparse
import os

import common
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from common import EVERY

from sparsecomm.tensorflow import DGC, RandomBlock, RandomK, RTopK, Threshold, TopK

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.5)
args = parser.parse_args()
hvd.init()
x_all, y_all = common.digits()
BATCHES = (16, 12)  # alternating: two traces of every step function


def tf_model():
    """The MLP 64-32-10 as (torch's name, variable) pairs in torch's layout (weight [out, in]).
    The variables themselves are unnamed: TF names each of them "Variable"."""
    rng = np.random.default_rng(0)
    shapes = {"0.weight": (32, 64), "0.bias": (32,), "2.weight": (10, 32), "2.bias": (10,)}
    return [(name, tf.Variable(rng.uniform(-0.2, 0.2, shape).astype(np.float32))) for name, shape in shapes.items()]


def plain(model):
    """The variables alone, as a user's plain list (the compressor names them Variable, Variable_1, ...)."""
    return [v for _, v in model]


def loss_of(model, x, y):
    w0, b0, w2, b2 = (v for _, v in model)
    hidden = tf.nn.relu(tf.matmul(x, w0, transpose_b=True) + b0)
    logits = tf.matmul(hidden, w2, transpose_b=True) + b2
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


# name -> (compression for the model's (name, variable) pairs, DistributedGradientTape options, how the step runs)
CONFIGS = {
    "dense": (lambda m: hvd.Compression.none, {}),
    "random_block_0.1": (lambda m: RandomBlock(ratio=0.1, seed=7, variables=m, **EVERY), {}),
    "random_block_1.0": (lambda m: RandomBlock(ratio=1.0, seed=7, variables=m, **EVERY), {}),
    "randomk_0.1": (lambda m: RandomK(ratio=0.1, seed=7, variables=m, **EVERY), {}),
    "randomk_1.0": (lambda m: RandomK(ratio=1.0, seed=7, variables=m, **EVERY), {}),
    "topk_0.1": (lambda m: TopK(exchange="allgather", ratio=0.1, variables=m, **EVERY), {}),
    "topk_1.0": (lambda m: TopK(exchange="allgather", ratio=1.0, variables=m, dense_fallback=False, **EVERY), {}),
    "topk_0.1_sum": (lambda m: TopK(exchange="allgather", ratio=0.1, variables=m, **EVERY), {"op": hvd.Sum}),
    "topk_0.1_predivide": (
        lambda m: TopK(exchange="allgather", ratio=0.1, variables=m, **EVERY),
        {"gradient_predivide_factor": 2.0},
    ),
    "topk_0.1_no_feedback": (
        lambda m: TopK(exchange="allgather", ratio=0.1, variables=m, error_feedback=False, **EVERY),
        {},
    ),
    "topk_0.1_default_policy": (lambda m: TopK(exchange="allgather", ratio=0.1, variables=m), {}),
    "topk_0.1_groups": (lambda m: TopK(exchange="allgather", ratio=0.1, variables=m, **EVERY), {"num_groups": 2}),
    "topk_0.1_eager": (lambda m: TopK(exchange="allgather", ratio=0.1, variables=m, **EVERY), {}, "eager"),
    "topk_0.1_allreduce": (lambda m: TopK(exchange="allgather", ratio=0.1, variables=m, **EVERY), {}, "allreduce"),
    "rtopk_0.1": (lambda m: RTopK(exchange="allgather", ratio=0.1, r=0.3, seed=7, variables=m, **EVERY), {}),
    "rtopk_1.0": (
        lambda m: RTopK(exchange="allgather", ratio=1.0, seed=7, variables=m, dense_fallback=False, **EVERY),
        {},
    ),
    "threshold_0.1": (lambda m: Threshold(exchange="allgather", ratio=0.1, variables=m, **EVERY), {}),
    "threshold_1.0": (
        lambda m: Threshold(exchange="allgather", ratio=1.0, variables=m, dense_fallback=False, **EVERY),
        {},
    ),
    "threshold_0.1_fp16": (
        lambda m: Threshold(exchange="allgather", ratio=0.1, quantize="fp16", variables=m, **EVERY),
        {},
    ),
    "threshold_0.1_1bit": (
        lambda m: Threshold(exchange="allgather", ratio=0.1, quantize="1bit", variables=m, **EVERY),
        {},
    ),
    "threshold_0.1_2bit": (
        lambda m: Threshold(exchange="allgather", ratio=0.1, quantize="2bit", variables=m, **EVERY),
        {},
    ),
    "dgc_0.1": (lambda m: DGC(exchange="allgather", ratio=0.1, momentum=0.9, variables=m, **EVERY), {}),
    "dgc_0.05_warmup_clip": (
        lambda m: DGC(
            exchange="allgather",
            ratio=0.05,
            momentum=0.9,
            warmup_steps=4,
            warmup_stages=2,
            clip_norm=0.2,
            variables=m,
            **EVERY,
        ),
        {},
    ),
    "dgc_0.5_warmup_dense_stage": (
        lambda m: DGC(
            exchange="allgather", ratio=0.5, momentum=0.9, warmup_steps=2, warmup_stages=1, variables=m, **EVERY
        ),
        {},
    ),
    "dgc_1.0_no_masking": (
        lambda m: DGC(
            exchange="allgather",
            ratio=1.0,
            momentum=0.9,
            momentum_masking=False,
            dense_fallback=False,
            variables=m,
            **EVERY,
        ),
        {},
    ),
    "dgc_0.1_default_policy": (lambda m: DGC(exchange="allgather", ratio=0.1, momentum=0.9, variables=m), {}),
    # the same with clipping: the dense route's momentum pass reads the clipping factor too
    "dgc_0.1_default_policy_clip": (
        lambda m: DGC(exchange="allgather", ratio=0.1, momentum=0.9, clip_norm=0.2, variables=m),
        {},
    ),
    # Nesterov momentum on the default policy: a sparse variable and the dense route's momentum pass
    "dgc_0.1_nesterov": (lambda m: DGC(exchange="allgather", ratio=0.1, momentum=0.9, nesterov=True, variables=m), {}),
    # every method bound to a plain list of unnamed variables: TF names them all "Variable"
    "plain_random_block_0.1": (lambda m: RandomBlock(ratio=0.1, seed=7, variables=plain(m), **EVERY), {}),
    "plain_randomk_0.1": (lambda m: RandomK(ratio=0.1, seed=7, variables=plain(m), **EVERY), {}),
    "plain_topk_0.1": (lambda m: TopK(exchange="allgather", ratio=0.1, variables=plain(m), **EVERY), {}),
    "plain_rtopk_0.1": (
        lambda m: RTopK(exchange="allgather", ratio=0.1, r=0.3, seed=7, variables=plain(m), **EVERY),
        {},
    ),
    "plain_threshold_0.1": (lambda m: Threshold(exchange="allgather", ratio=0.1, variables=plain(m), **EVERY), {}),
    "plain_dgc_0.1": (lambda m: DGC(exchange="allgather", ratio=0.1, momentum=0.9, variables=plain(m), **EVERY), {}),
}


def make_step(model, compression, options, mode):
    variables = [v for _, v in model]

    def step(x, y):
        with tf.GradientTape(persistent=True) as tape:
            loss = loss_of(model, x, y)
        local = tape.gradient(loss, variables)
        if mode == "allreduce":  # hvd.allreduce with compression=, gradient by gradient
            grads = [
                hvd.allreduce(g, op=hvd.Average, compression=compression, name=f"g{i}") for i, g in enumerate(local)
            ]
        else:
            grads = hvd.DistributedGradientTape(tape, compression=compression, **options).gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(args.lr * g)
        return local

    return step if mode in ("eager", "allreduce") else tf.function(step)


out = {}
for config, (make_compression, options, *mode) in CONFIGS.items():
    model = tf_model()
    compression = make_compression(model)
    step_fn = make_step(model, compression, options, mode[0] if mode else "function")
    for step in range(args.steps):
        idx = common.rows(step, hvd.rank(), hvd.size(), len(y_all), batch=BATCHES[step % 2])
        local = step_fn(tf.constant(x_all[idx]), tf.constant(y_all[idx]))
        for (name, v), g in zip(model, local):
            out[f"{config}/grad/{step}/{name}"] = g.numpy()
            out[f"{config}/param/{step}/{name}"] = v.numpy()
    if hasattr(compression, "stats"):
        stats = compression.stats()
        out[f"{config}/stats/sent_bytes"] = np.array(stats["sent_bytes"])
        out[f"{config}/stats/dense_bytes"] = np.array(stats["dense_bytes"])
        out[f"{config}/stats/received_bytes"] = np.array(stats["received_bytes"])
        out[f"{config}/stats/calls"] = np.array(stats["calls"])
        out[f"{config}/stats/names"] = np.array(list(stats["tensors"]))
for name, v in tf_model():
    out[f"initial/{name}"] = v.numpy()
np.savez(os.path.join(args.out, f"rank{hvd.rank()}.npz"), **out)
print(f"rank {hvd.rank()}/{hvd.size()}: {len(CONFIGS)} configs x {args.steps} steps done")
