"""Worker: a few SGD steps of a small MLP on digits with hvd.DistributedGradientTape inside
tf.function (and, for some configs, eager and hvd.allreduce), for each sparsecomm.tensorflow
compressor, bound to (name, variable) pairs and (the "plain_" configs) to the plain list of
the model's unnamed variables. Saves every rank's local gradients (before the exchange) and parameters after
every step, so the test can replay the exchange with a plain reference, bit for bit.

The batch size alternates between two values. The RETRACED configs (one per compressor class,
its quantized and warm-up forms) trace their step for each batch size, and the compressor state
must carry across the two traces; the others trace once, for any batch size (a TF trace is
most of this worker's time). --sizes: each size in turn on the first N ranks (common.sizes_of),
saved in the folder np<N>."""

import os

import common
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import sparsecomm.tensorflow

args = common.add_sizes_argument(common.worker_parser(steps=5, lr=0.5)).parse_args()
SETS = common.sizes_of(hvd, args.sizes)
x_all, y_all = common.digits()
BATCHES = (16, 12)  # alternating: two traces of a RETRACED config's step function
RETRACED = (
    "random_block_0.1",
    "randomk_0.1",
    "topk_0.1",
    "rtopk_0.1",
    "threshold_0.1",
    "threshold_0.1_2bit",
    "dgc_0.1",
    "dgc_0.05_warmup_clip",
)
ANY_BATCH = (tf.TensorSpec([None, 64], tf.float32), tf.TensorSpec([None], tf.int64))


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


TRAINED = common.train_compressors(sparsecomm.tensorflow)


def bound(config, variables=lambda model: model):
    """The compressor of TRAINED[config], bound to variables(the model's (name, variable) pairs),
    over the process set that `on` gives (common.set_arguments)."""
    return lambda model, on: TRAINED[config](dict(variables=variables(model), **on))


# name -> (compression for the model's (name, variable) pairs and the set's arguments,
# DistributedGradientTape options, how the step runs)
CONFIGS = {
    "dense": (lambda m, on: hvd.Compression.none, {}),
    **{config: (bound(config), {}) for config in TRAINED},
    "topk_0.1_sum": (bound("topk_0.1"), {"op": hvd.Sum}),
    "topk_0.1_predivide": (bound("topk_0.1"), {"gradient_predivide_factor": 2.0}),
    "topk_0.1_groups": (bound("topk_0.1"), {"num_groups": 2}),
    "topk_0.1_eager": (bound("topk_0.1"), {}, "eager"),
    "topk_0.1_allreduce": (bound("topk_0.1"), {}, "allreduce"),
    # every method bound to a plain list of unnamed variables: TF names them all "Variable"
    **{
        f"plain_{config}": (bound(config, plain), {})
        for config in ("random_block_0.1", "randomk_0.1", "topk_0.1", "rtopk_0.1", "threshold_0.1", "dgc_0.1")
    },
}


def make_step(model, compression, options, mode, retraced, on):
    """The step of one config; `on`: the process set's arguments (common.set_arguments)."""
    variables = [v for _, v in model]

    def step(x, y):
        with tf.GradientTape(persistent=True) as tape:
            loss = loss_of(model, x, y)
        local = tape.gradient(loss, variables)
        if mode == "allreduce":  # hvd.allreduce with compression=, gradient by gradient
            grads = [
                hvd.allreduce(g, op=hvd.Average, compression=compression, name=f"g{i}", **on)
                for i, g in enumerate(local)
            ]
        else:
            distributed = hvd.DistributedGradientTape(tape, compression=compression, **options, **on)
            grads = distributed.gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(args.lr * g)
        return local

    if mode in ("eager", "allreduce"):
        return step
    return tf.function(step, input_signature=None if retraced else ANY_BATCH)


def run(size, process_set):
    """Every config on the ranks of `process_set`, saved in the folder of `size`."""
    on, out = common.set_arguments(hvd, process_set), {}
    for config, (make_compression, options, *mode) in CONFIGS.items():
        model = tf_model()
        compression = make_compression(model, on)
        step_fn = make_step(model, compression, options, mode[0] if mode else "function", config in RETRACED, on)
        for step in range(args.steps):
            idx = common.rows(step, process_set.rank(), size, len(y_all), batch=BATCHES[step % 2])
            local = step_fn(tf.constant(x_all[idx]), tf.constant(y_all[idx]))
            for (name, v), g in zip(model, local):
                out[f"{config}/grad/{step}/{name}"] = g.numpy()
                out[f"{config}/param/{step}/{name}"] = v.numpy()
        if hasattr(step_fn, "experimental_get_tracing_count"):
            out[f"{config}/traces"] = np.array(step_fn.experimental_get_tracing_count())
        if hasattr(compression, "stats"):
            stats = compression.stats()
            for key in ("sent_bytes", "dense_bytes", "received_bytes", "calls"):
                out[f"{config}/stats/{key}"] = np.array(stats[key])
            out[f"{config}/stats/names"] = np.array(list(stats["tensors"]))
    for name, v in tf_model():
        out[f"initial/{name}"] = v.numpy()
    np.savez(os.path.join(common.size_folder(args.out, size), f"rank{process_set.rank()}.npz"), **out)
    print(f"rank {process_set.rank()}/{size}: {len(CONFIGS)} configs x {args.steps} steps done")


common.for_each_size(hvd, SETS, run, tf.zeros(1))
