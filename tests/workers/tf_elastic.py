"""Elastic Horovod with every TF compressor: tests/workers/torch_elastic.py's scenario (2 ranks
train, a third joins, then leaves by discovery or dies mid-step) with hvd.DistributedGradientTape
in a tf.function, the state in hvd.elastic.TensorFlowKerasState (tf-keras), with the compressors
tracked by sparsecomm.tensorflow.elastic.track or (--recipe horovod) not. Every rank checks at
every step that all ranks agree; the test reads the printed lines. The step function is made
inside train(), so each reset traces it for the new number of ranks.

(hvd.elastic.TensorFlowState cannot take a joiner under TF2 in Horovod 0.28.1: its constructor
broadcasts the variables, a collective only the joiner starts, and its sync broadcasts nothing
eagerly. TensorFlowKerasState broadcasts the model in sync, so the variables are held by a
tf-keras Model here.)"""

import common
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
import tf_keras

import sparsecomm.tensorflow as sctf
from sparsecomm.tensorflow import elastic

METHODS = common.elastic_compressors(sctf)
SHAPES = {"0.weight": (32, 64), "0.bias": (32,), "2.weight": (10, 32), "2.bias": (10,)}


def model_for(method):
    rng = np.random.default_rng(0)
    return [
        (f"{method}.{name}", tf.Variable(rng.uniform(-0.2, 0.2, shape).astype(np.float32)))
        for name, shape in SHAPES.items()
    ]


def loss_of(model, x, y):
    w0, b0, w2, b2 = (v for _, v in model)
    hidden = tf.nn.relu(tf.matmul(x, w0, transpose_b=True) + b0)
    logits = tf.matmul(hidden, w2, transpose_b=True) + b2
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


class Held(tf_keras.Model):
    """The models' variables, held by one built tf-keras Model for TensorFlowKerasState."""

    def __init__(self, variables):
        super().__init__()
        self.held = list(variables)
        self.built = True


def main():
    args = common.elastic_args(recipe="the compressors are not tracked by the state")
    hvd.init()
    x, y = common.digits()
    models = {m: model_for(m) for m in METHODS}
    compressors = {m: make(dict(variables=models[m])) for m, make in METHODS.items()}
    state = hvd.elastic.TensorFlowKerasState(
        Held(v for model in models.values() for _, v in model),
        tf_keras.optimizers.SGD(0.1),
        step=0,
        phase="grow",
        mark=0,
    )
    if args.recipe == "sparsecomm":
        elastic.track(state, *compressors.values())
    joined = hvd.size() == 3
    scenario = common.ElasticScenario(args.hosts, args.fail)
    scenario.log_resets(state, hvd)

    def steps_of(compressor):
        return [(s.variable_name, int(s.step.numpy())) for s in compressor.state]

    def agreed():
        """Before a step: every rank's step and parameters are the same."""
        digest = common.digest(v.numpy() for m in models.values() for _, v in m)
        common.same_everywhere(hvd, (state.step, digest), "parameters", state.step)

    def counted():
        """After a step: every rank's compressor steps are the same (a joiner adopts rank 0's when
        its step is traced); tracked, each compressor counted exactly the committed steps and this one."""
        steps = [steps_of(c) for c in compressors.values()]
        counts = (step for per in steps for _, step in per)
        common.check_counted(hvd, state, steps, counts, exact=args.recipe == "sparsecomm")

    def residual_norm():
        return common.tf_residual_norm(compressors.values())

    @elastic.run  # hvd.elastic.run would end train() silently on a failed alltoall (see elastic.run)
    def train(state):
        # Made here, so every reset traces the steps again for the new number of ranks.
        def make_step(model, compression):
            variables = [v for _, v in model]

            @tf.function(autograph=False)  # docs/testing.md, "TF workers"
            def step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = loss_of(model, xb, yb)
                tape = hvd.DistributedGradientTape(tape, compression=compression)
                for v, g in zip(variables, tape.gradient(loss, variables)):
                    v.assign_sub(0.1 * g)

            return step

        steps = {m: make_step(models[m], compressors[m]) for m in METHODS}
        for rows in scenario.steps(state, hvd, len(x), agreed, joined, residual_norm):
            for i, method in enumerate(METHODS):
                if i == 1:
                    scenario.die_if_due(state, hvd.rank())  # after the first method's step
                steps[method](tf.constant(x[rows]), tf.constant(y[rows]))
            counted()

    train(state)
    for method, model in models.items():
        digest = common.digest(v.numpy() for _, v in model)
        loss = float(loss_of(model, tf.constant(x[:256]), tf.constant(y[:256])))
        print(
            f"final {method}: rank {hvd.rank()} of {hvd.size()} step {state.step} params {digest} "
            f"steps {steps_of(compressors[method])} loss {loss:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
