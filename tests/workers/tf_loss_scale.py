"""Worker: mixed precision (loss_scaler=) with every TF compressor, Keras 3. Per config:

- "scaled": 10 float32 steps of a Keras 3 MLP under keras.optimizers.LossScaleOptimizer
  (SGD inside; initial scale 2**10, growth every 3 good steps) with hvd.DistributedGradientTape
  in tf.function; at step OVERFLOW, rank 1's 0.weight gradient gets one inf (a loss term
  poison * kernel[5, 7], poison = inf there, 0 elsewhere), so the optimizer skips that step and
  halves its scale. The scale goes 2**10, 2**11, back to 2**10, 2**11.
- "reference": the same compressor and steps with plain SGD, no scaling, without step OVERFLOW.
- "resumed" (RESUMED configs: each run traces its step anew, which is slow): the scaled run,
  checkpointed (weights, optimizer variables, tf.train.Checkpoint of the compressor) and
  rebuilt after step 2 (growth pending) and step OVERFLOW (rollback pending).
- "fit": model.fit under the "mixed_bfloat16" policy with sparsecomm's Keras 3
  DistributedOptimizer around a LossScaleOptimizer: losses, finite state, and whether the
  compressor follows the wrapped optimizer.
"""

import os

import common
import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

import sparsecomm.tensorflow
from sparsecomm.tensorflow import keras as sckeras

args = common.worker_parser().parse_args()
hvd.init()
x_all, y_all = common.digits()
STEPS, OVERFLOW, LR = 10, 4, 0.5
CONFIGS = common.loss_scale_configs(sparsecomm.tensorflow)
RESUMED = ("dgc", "randomk")


def mlp(dtype=None):
    keras.utils.set_random_seed(0)  # the same weights on every rank and in every run
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(32, activation="relu", dtype=dtype),
            keras.layers.Dense(10, dtype=dtype),
        ]
    )


class Run:
    def __init__(self, make, scaled):
        self.model = mlp()
        variables = self.model.trainable_variables
        self.opt = keras.optimizers.SGD(LR)
        if scaled:
            self.opt = keras.optimizers.LossScaleOptimizer(self.opt, initial_scale=2.0**10, dynamic_growth_steps=3)
        self.opt.build(variables)  # the scale variable exists before the first trace
        named = [(f"v{i}", v) for i, v in enumerate(variables)]  # the same names (coordinate streams) in every run
        self.compression = make(dict(variables=named, loss_scaler=self.opt if scaled else None))
        self.poison = tf.Variable(0.0)
        kernel = self.model.layers[0].kernel

        @tf.function(autograph=False)  # docs/testing.md, "TF workers"
        def step(x, y):
            with tf.GradientTape() as tape:
                logits = self.model(x)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
                loss = loss + self.poison * kernel[5, 7]
                if scaled:
                    loss = self.opt.scale_loss(loss)
            # Horovod's tape takes tf.Variables: a Keras 3 variable's is its .value
            grads = hvd.DistributedGradientTape(tape, compression=self.compression).gradient(
                loss, [v.value for v in variables]
            )
            self.opt.apply(grads, variables)

        self.step = step

    def train(self, steps, scales=None):
        for step in steps:
            if scales is not None:
                scales.append(float(self.opt.dynamic_scale.numpy()))
            self.poison.assign(float("inf") if step == OVERFLOW and hvd.rank() == 1 else 0.0)
            idx = common.rows(step, hvd.rank(), hvd.size(), len(y_all))
            self.step(tf.constant(x_all[idx]), tf.constant(y_all[idx]))

    def weights(self):
        return [w.numpy() for w in self.model.trainable_variables]

    def checkpoint(self, path):
        tf.train.Checkpoint(compression=self.compression).write(path)
        return [w.numpy() for w in self.model.variables], [v.numpy() for v in self.opt.variables]

    def restore(self, saved, path):
        weights, optimizer = saved
        for v, w in zip(self.model.variables, weights):
            v.assign(w)
        for v, w in zip(self.opt.variables, optimizer):
            v.assign(w)
        tf.train.Checkpoint(compression=self.compression).read(path).assert_consumed()


out = {}
for config, make in CONFIGS.items():
    scaled, scales = Run(make, scaled=True), []
    scaled.train(range(STEPS), scales)
    out[f"{config}/scales"] = np.array(scales)
    out[f"{config}/steps"] = np.array([int(s.step.numpy()) for s in scaled.compression.state])
    out[f"{config}/loss_scales"] = np.array([float(s.loss_scale.numpy()) for s in scaled.compression.state])
    for i, w in enumerate(scaled.weights()):
        out[f"{config}/scaled/{i}"] = w

    reference = Run(make, scaled=False)
    reference.train([s for s in range(STEPS) if s != OVERFLOW])
    out[f"{config}/reference_steps"] = np.array([int(s.step.numpy()) for s in reference.compression.state])
    for i, w in enumerate(reference.weights()):
        out[f"{config}/reference/{i}"] = w

    if config not in RESUMED:
        continue
    run = Run(make, scaled=True)
    for steps in (range(0, 3), range(3, OVERFLOW + 1), range(OVERFLOW + 1, STEPS)):
        if steps.start:
            path = os.path.join(args.out, f"{config}_rank{hvd.rank()}_{steps.start}")
            saved = run.checkpoint(path)
            run = Run(make, scaled=True)  # a fresh start, as after a restart
            run.restore(saved, path)
        run.train(steps)
    for i, w in enumerate(run.weights()):
        out[f"{config}/resumed/{i}"] = w
for i, w in enumerate(mlp().get_weights()):
    out[f"initial/{i}"] = w

# model.fit under mixed_bfloat16, DGC, through sparsecomm's Keras 3 DistributedOptimizer
model = mlp("mixed_bfloat16")
optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
compression = sparsecomm.tensorflow.DGC(
    ratio=0.1, momentum=0.9, exchange="allgather", variables=model.trainable_variables, loss_scaler=optimizer
)
model.compile(
    optimizer=sckeras.DistributedOptimizer(optimizer, compression),
    jit_compile=False,
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
)
shard = np.arange(len(y_all))[hvd.rank() :: hvd.size()]
history = model.fit(
    x_all[shard],
    y_all[shard],
    batch_size=32,
    epochs=4,
    shuffle=False,
    verbose=0,
    callbacks=[sckeras.BroadcastInitialVariables(root_rank=0)],
)
out["fit/losses"] = np.array(history.history["loss"])
out["fit/follows_the_wrapper"] = np.array(compression._scaler is model.optimizer)
out["fit/finite"] = np.array(
    all(
        bool(tf.reduce_all(tf.math.is_finite(v)).numpy())
        for s in compression.state
        for v in (s.residual, s.momentum)
        if v is not None
    )
)
out["fit/loss_scale"] = np.array([float(s.loss_scale.numpy()) for s in compression.state])
out["fit/optimizer_scale"] = np.array(float(model.optimizer.dynamic_scale.numpy()))
np.savez(os.path.join(args.out, f"rank{hvd.rank()}.npz"), **out)
print(f"rank {hvd.rank()}: done")
