"""Elastic Horovod with Keras 3: tests/workers/tf_elastic.py's scenario (2 ranks train, a third
joins, then leaves by discovery or dies mid-step) with one Keras 3 model of three branches, one
Keras 3 SGD with momentum (its slots and `iterations` are state too), a compressor per branch
(hvd.DistributedGradientTape in a tf.function made inside train()) and the state in
sparsecomm.tensorflow.keras.ElasticState. The ranks start from different weights (each seeds
with its rank): only the state's sync brings them together, and a joiner's too.

Every rank checks at every step that all ranks hold the same parameters and optimizer variables
(before the step) and compressor steps (after it: a joiner adopts rank 0's at its first
compress), and that the optimizer and every compressor counted exactly the committed steps. A
survivor of a failure prints whether its uncommitted step had changed its state and whether the
restore brought it back to the commit; the test reads the printed lines."""

import common
import horovod.tensorflow as hvd
import keras
import tensorflow as tf

import sparsecomm.tensorflow as sctf
from sparsecomm.tensorflow import elastic
from sparsecomm.tensorflow import keras as sckeras

METHODS = {m: make for m, make in common.elastic_compressors(sctf).items() if m in ("DGC", "TopK", "RandomBlock")}
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def branches_and_model():
    """A Keras 3 Sequential per method, and one functional model holding the three."""
    keras.utils.set_random_seed(hvd.rank() + 1)  # different initial weights on every rank
    branches = {
        m: keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)], name=m
        )
        for m in METHODS
    }
    inputs = keras.Input((64,))
    return branches, keras.Model(inputs, [branch(inputs) for branch in branches.values()])


def digest(variables):
    return common.digest(v.numpy() for v in variables)


def main():
    args = common.elastic_args()
    hvd.init()
    x, y = common.digits()
    branches, model = branches_and_model()
    compressors = {m: make(dict(variables=branches[m].trainable_variables)) for m, make in METHODS.items()}
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    state = sckeras.ElasticState(model, optimizer, list(compressors.values()), step=0, phase="grow", mark=0)
    joined = hvd.size() == 3
    scenario = common.ElasticScenario(args.hosts, args.fail)
    scenario.log_resets(state, hvd)
    compressor_variables = [v for c in compressors.values() for v in c.variables]
    local = lambda: digest(list(model.variables) + list(optimizer.variables) + compressor_variables)  # noqa: E731
    seen = {"committed": None, "failed": False}

    def steps_of(compressor):
        return [int(s.step.numpy()) for s in compressor.state]

    def agreed():
        """Before a step: the same step, parameters and optimizer variables everywhere, and the
        optimizer counted exactly the committed steps."""
        iterations = int(optimizer.iterations.numpy())
        if iterations != len(METHODS) * state.step:
            raise AssertionError(f"rank {hvd.rank()}: optimizer iterations {iterations} at step {state.step}")
        mine = (state.step, digest(model.variables), digest(optimizer.variables))
        common.same_everywhere(hvd, mine, "parameters and optimizer variables", state.step)

    def counted():
        """After a step: every compressor counted exactly the committed steps and this one, on
        every rank (a joiner adopts rank 0's steps at its first compress)."""
        steps = {m: steps_of(c) for m, c in compressors.items()}
        common.check_counted(hvd, state, steps, (s for per in steps.values() for s in per))

    def residual_norm():
        return common.tf_residual_norm(compressors.values())

    @elastic.run  # hvd.elastic.run would end train() silently on some failed collectives (see elastic.run)
    def train(state):
        if seen["failed"]:
            print(
                f"rolled back: rank {hvd.rank()} at step {state.step} to the commit {local() == seen['committed']}",
                flush=True,
            )
            seen["failed"] = False

        def make_step(branch, compression):  # made here: each reset traces the steps again
            variables = branch.trainable_variables
            # Horovod's tape calls .ref() on its sources, which Keras 3 variables lack: their tf.Variables
            sources = [v.value for v in variables]

            @tf.function(autograph=False)  # docs/testing.md, "TF workers"
            def step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = LOSS(yb, branch(xb, training=True))
                tape = hvd.DistributedGradientTape(tape, compression=compression)
                optimizer.apply(tape.gradient(loss, sources), variables)

            return step

        steps = {m: make_step(branches[m], compressors[m]) for m in METHODS}
        for rows in scenario.steps(state, hvd, len(x), agreed, joined, residual_norm):
            seen["committed"] = local()  # the state as committed after the previous step (or synced)
            try:
                for i, method in enumerate(METHODS):
                    if i == 1:
                        scenario.die_if_due(state, hvd.rank())  # after the first method's step
                    steps[method](tf.constant(x[rows]), tf.constant(y[rows]))
            except tf.errors.UnknownError:  # a rank failed
                seen["failed"] = True
                print(
                    f"failed: rank {hvd.rank()} at step {state.step} changed {local() != seen['committed']}", flush=True
                )
                raise
            counted()

    train(state)
    for method, branch in branches.items():
        loss = float(LOSS(y[:256], branch(x[:256])))
        print(
            f"final {method}: rank {hvd.rank()} of {hvd.size()} step {state.step} params {digest(branch.variables)} "
            f"optimizer {digest(optimizer.variables)} steps {steps_of(compressors[method])} loss {loss:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
