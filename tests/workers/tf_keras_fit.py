"""Worker: model.fit on digits (real data), each rank on its own shard, with dense
allreduce and with DGC, under tf-keras (--keras legacy: Horovod's own Keras
DistributedOptimizer and broadcast callback) or Keras 3 (--keras 3: sparsecomm's Keras 3
optimizer wrapper and broadcast callback). Saves test accuracy and final weights per rank."""

import argparse
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--keras", choices=["legacy", "3"], required=True)
parser.add_argument("--epochs", type=int, default=25)
args = parser.parse_args()
if args.keras == "legacy":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported: tf.keras is tf-keras

import common  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparsecomm.tensorflow as sctf  # noqa: E402

hvd.init()
if args.keras == "legacy":
    import horovod.tensorflow.keras as hvd_keras

    keras = tf.keras
    assert keras.__name__.startswith("tf_keras"), keras.__name__
else:
    import keras

    from sparsecomm.tensorflow import keras as sckeras

    assert keras.__version__.startswith("3"), keras.__version__

x_all, y_all = common.digits()
order = np.random.default_rng(0).permutation(len(y_all))
test, train = order[:360], order[360:]
shard = train[hvd.rank() :: hvd.size()]
BATCH = 32


def model_and_optimizer(method):
    keras.utils.set_random_seed(hvd.rank() + 1)  # different initial weights per rank: the broadcast must fix them
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    if method == "dense":
        compression, optimizer = None, keras.optimizers.SGD(0.05, momentum=0.9)
    else:  # DGC keeps the momentum itself: plain SGD
        compression = sctf.DGC(
            ratio=0.01, exchange="allgather", momentum=0.9, warmup_steps=40, variables=model.trainable_variables
        )
        optimizer = keras.optimizers.SGD(0.05)
    if args.keras == "legacy":
        optimizer = hvd_keras.DistributedOptimizer(optimizer, compression=compression or hvd.Compression.none)
        callbacks = [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)]
    else:
        optimizer = sckeras.DistributedOptimizer(optimizer, compression)
        callbacks = [sckeras.BroadcastInitialVariables(root_rank=0)]
    model.compile(
        optimizer=optimizer,
        jit_compile=False,
        metrics=["accuracy"],
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model, callbacks, compression


results = {}
for method in ("dense", "dgc"):
    model, callbacks, compression = model_and_optimizer(method)
    model.fit(
        x_all[shard], y_all[shard], batch_size=BATCH, epochs=args.epochs, shuffle=False, verbose=0, callbacks=callbacks
    )
    _, accuracy = model.evaluate(x_all[test], y_all[test], verbose=0)
    results[method] = {"accuracy": float(accuracy)}
    if compression is not None:
        stats = compression.stats()
        results[method].update(sent_bytes=stats["sent_bytes"], dense_bytes=stats["dense_bytes"])
    np.savez(os.path.join(args.out, f"{method}_rank{hvd.rank()}.npz"), *[w for w in model.get_weights()])
with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump(results, f)
print(f"rank {hvd.rank()}: {results}")
