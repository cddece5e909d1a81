"""Worker: a soak run. The compressors train side by side, each its own copy of the MLP on digits
(torch: hvd.DistributedOptimizer; TF: hvd.DistributedGradientTape, all of them in one
tf.function), every step of each in one loop turn, so that Horovod's cycles carry all their
collectives together. Each compressor's parameters are named after it (its collectives' names
must differ from the others'). At step --warmup and every --every steps after it, the worker
samples this process's resident set size, its live tensors (torch.Tensor; TF: tf.Variable and
EagerTensor, counted through gc) and, for TF, how many times the step was traced. Prints one line
per rank: "soak <framework> rank <r> <json: samples, seconds, routes per compressor>". A growth
is the process's: `--only NAME` reruns one compressor to see which grows.

--leak (the check that the test can fail): "tensors": the first compressor keeps every gradient
it compresses in a list (TF: by a py_function in the graph, so at every step, not once per
trace); "bytes=N": it keeps N bytes of plain Python memory per call instead (no tensor)."""

import argparse
import ctypes
import gc
import json
import os
import time

import common
from common import EVERY

parser = argparse.ArgumentParser()
parser.add_argument("--framework", choices=("torch", "tf"), required=True)
parser.add_argument("--steps", type=int, default=5000)
parser.add_argument("--warmup", type=int, default=500)
parser.add_argument("--every", type=int, default=500)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--leak", default=None)
parser.add_argument("--only", nargs="*", help="these compressors only (default: all)")
args = parser.parse_args()
gc.set_threshold(*common.PYTHON_GC_THRESHOLDS)  # common.py raises them: memory as a user's process holds it
PAGE = os.sysconf("SC_PAGE_SIZE")
RATIO = 0.05
KEPT = []  # what --leak keeps
try:  # glibc's malloc_trim (see rss_bytes)
    TRIM = ctypes.CDLL("libc.so.6").malloc_trim
except (OSError, AttributeError):
    TRIM = None


def compressors(sc, bind):
    """name -> compressor maker, from sparsecomm.torch or sparsecomm.tensorflow; `bind` gives
    the binding keyword argument for a list of (name, parameter) pairs. exchange="auto" settles
    on dense for this model on one machine (its trial runs the sparse exchanges in the warm-up
    only), and a dense route skips the methods' packs: TopK_auto soaks auto, the others pin
    "allgather" (RandomK and RandomBlock have no choice: Horovod's allreduce of shared
    coordinates)."""
    gather = dict(EVERY, exchange="allgather")
    makers = {
        "TopK_auto": lambda m: sc.TopK(ratio=RATIO, **EVERY, **bind(m)),
        "TopK": lambda m: sc.TopK(ratio=RATIO, **gather, **bind(m)),
        "RTopK": lambda m: sc.RTopK(ratio=RATIO, seed=7, **gather, **bind(m)),
        "RandomK": lambda m: sc.RandomK(ratio=RATIO, seed=7, **EVERY, **bind(m)),
        "RandomBlock": lambda m: sc.RandomBlock(ratio=RATIO, seed=7, **EVERY, **bind(m)),
        "Threshold": lambda m: sc.Threshold(ratio=RATIO, **gather, **bind(m)),
        "DGC": lambda m: sc.DGC(ratio=RATIO, momentum=0.9, warmup_steps=50, **gather, **bind(m)),
        "Threshold_2bit": lambda m: sc.Threshold(ratio=RATIO, quantize="2bit", **gather, **bind(m)),
    }
    return {name: make for name, make in makers.items() if not args.only or name in args.only}


def rss_bytes():
    """Resident bytes: /proc/self/statm's second field (stdlib; no psutil). First, glibc gives
    its free memory back to the system: what stays resident is what is in use."""
    if TRIM is not None:
        TRIM(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def live(types):
    """Objects of `types` that gc can see, after a full collection (only what is reachable)."""
    gc.collect()
    return sum(isinstance(o, types) for o in gc.get_objects())


def break_on_purpose(compression, keep):
    """--leak: wraps the compressor's compress so that `keep(tensor)` runs on every gradient."""
    compress = compression.compress

    def leaking(tensor, *rest, **kw):
        keep(tensor)
        return compress(tensor, *rest, **kw)

    compression.compress = leaking


def keeper(clone):
    """The function --leak runs on each gradient: keeps a copy (`clone`), or N bytes of memory."""
    if args.leak == "tensors":
        return lambda tensor: KEPT.append(clone(tensor))
    size = int(args.leak.split("=")[1])
    return lambda tensor: KEPT.append(bytearray(size))


def sampled(step):
    return step >= args.warmup and (step - args.warmup) % args.every == 0


def sample(step, types, **extra):
    """One sample: the live objects of `types`, then (after that full collection, so that no
    garbage waiting for the collector counts) the resident bytes."""
    tensors = live(types)
    return dict(step=step, tensors=tensors, rss=rss_bytes(), **extra)


def report(framework, rank, samples, started, runs):
    """The rank's line: its samples, the seconds of the run, and each compressor's routes."""
    routes = {name: sorted({t.get("exchange", "shared") for t in c.stats()["tensors"].values()}) for name, c in runs}
    line = dict(samples=samples, seconds=round(time.monotonic() - started, 1), routes=routes)
    print(f"soak {framework} rank {rank} {json.dumps(line)}", flush=True)


def run_torch():
    import horovod.torch as hvd
    import torch

    import sparsecomm.torch as sc

    hvd.init()
    torch.set_num_threads(1)
    x_all, y_all = (torch.from_numpy(a) for a in common.digits())
    # Horovod sometimes still holds the last collective's tensors when a step returns, until its
    # next operation: this in-place allreduce before each sample lets it drop them
    sync = torch.zeros(1)
    started, runs = time.monotonic(), []
    for number, (name, make) in enumerate(compressors(sc, lambda named: dict(named_parameters=named)).items()):
        model = common.torch_model()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        named = [(f"{name}.{n}", p) for n, p in model.named_parameters()]
        compression = make(named)
        if args.leak and number == 0:
            break_on_purpose(compression, keeper(torch.clone))
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=args.lr), named_parameters=named, compression=compression
        )
        runs.append((name, model, compression, opt))
    samples = []
    for step in range(args.steps + 1):
        if sampled(step):
            hvd.allreduce_(sync, name="soak.sync")
            samples.append(sample(step, torch.Tensor))
        if step < args.steps:
            idx = torch.from_numpy(common.rows(step, hvd.rank(), hvd.size(), len(y_all)))
            for _, model, _, opt in runs:  # every backward's collectives start before any step waits
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
            for *_, opt in runs:
                opt.step()
    report("torch", hvd.rank(), samples, started, [(name, c) for name, _, c, _ in runs])


def tf_model(tf, prefix):
    """The MLP 64-32-10 as (name, variable) pairs, the same initial weights on every rank."""
    import numpy as np

    rng = np.random.default_rng(0)
    shapes = {"0.weight": (64, 32), "0.bias": (32,), "2.weight": (32, 10), "2.bias": (10,)}
    return [
        (f"{prefix}.{name}", tf.Variable(rng.uniform(-0.2, 0.2, shape).astype(np.float32)))
        for name, shape in shapes.items()
    ]


def tf_step(tf, hvd, runs):
    """One tf.function that steps every (model, compression) of `runs` on the same batch."""

    @tf.function
    def step(x, y):
        for model, compression in runs:
            variables = [v for _, v in model]
            with tf.GradientTape() as tape:
                w0, b0, w2, b2 = variables
                logits = tf.matmul(tf.nn.relu(tf.matmul(x, w0) + b0), w2) + b2
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            grads = hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, variables)
            for v, g in zip(variables, grads):
                v.assign_sub(args.lr * g)

    return step


def tf_keeper(tf):
    # compress runs once per trace in tf.function: a py_function runs the keeper at every step
    keep = keeper(lambda t: t)  # the py_function's eager copy of the gradient
    return lambda tensor: tf.py_function(keep, [tensor], [])


def run_tf():
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import sparsecomm.tensorflow as sc

    hvd.init()
    x_all, y_all = common.digits()
    kinds = (tf.Variable, type(tf.constant(0.0)))  # EagerTensor has no public name
    started, runs = time.monotonic(), []
    for number, (name, make) in enumerate(compressors(sc, lambda m: dict(variables=m)).items()):
        model = tf_model(tf, name)
        compression = make(model)
        if args.leak and number == 0:
            break_on_purpose(compression, tf_keeper(tf))
        runs.append((name, model, compression))
    step_fn = tf_step(tf, hvd, [(model, compression) for _, model, compression in runs])
    samples = []
    for step in range(args.steps + 1):
        if sampled(step):
            samples.append(sample(step, kinds, traces=step_fn.experimental_get_tracing_count()))
        if step < args.steps:
            idx = common.rows(step, hvd.rank(), hvd.size(), len(y_all))
            step_fn(tf.constant(x_all[idx]), tf.constant(y_all[idx]))
    report("tf", hvd.rank(), samples, started, [(name, c) for name, _, c in runs])


if __name__ == "__main__":
    run_torch() if args.framework == "torch" else run_tf()
