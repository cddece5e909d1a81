"""Elastic Horovod with Keras 3 (sparsecomm.tensorflow.keras.ElasticState): real elastic
horovodrun with a host discovery script, tests/workers/tf_keras_elastic.py's ranks (2 train, a
third joins, then dies mid-step or leaves by discovery); and the state's arguments and
save/restore on one process. The workers check at every step that all ranks hold the same
parameters, optimizer variables and compressor steps; here: the joiner joined with zero
residuals while the survivors kept theirs, a failure rolled the survivors back, and every
remaining rank finished with the same parameters and optimizer variables."""

import re

import pytest
from launch import horovodrun_elastic

METHODS = ("DGC", "TopK", "RandomBlock")


@pytest.mark.parametrize("shrink", ["fail", "leave"])
def test_keras3_state_follows_a_worker_joining_and_leaving(shrink, tmp_path):
    output = horovodrun_elastic("tf_keras_elastic.py", tmp_path, *(["--fail"] if shrink == "fail" else []), timeout=300)
    worlds = re.findall(r"world: rank (\d) of (\d) at step (\d+) joined (\w+) residual (\S+)", output)
    grown = [w for w in worlds if w[1] == "3"]
    assert sorted(w[0] for w in grown) == ["0", "1", "2"], output[-4000:]
    for rank, _, _, joined, residual in grown:
        assert (joined == "True") == (rank == "2") and (float(residual) == 0) == (rank == "2"), grown
    shrunk = [w for w in worlds if w[1] == "2" and w[2] != "0"]
    assert sorted(w[0] for w in shrunk) == ["0", "1"], output[-4000:]
    if shrink == "fail":
        died = re.findall(r"rank 2 dies at step (\d+)", output)
        assert len(died) == 1, output[-4000:]
        # the survivors had run part of the step that failed, and the restore undid it
        assert sorted(re.findall(rf"failed: rank (\d) at step {died[0]} changed True", output)) == ["0", "1"], output[
            -4000:
        ]
        assert sorted(re.findall(rf"rolled back: rank (\d) at step {died[0]} to the commit True", output)) == [
            "0",
            "1",
        ], output[-4000:]
        assert {w[2] for w in shrunk} == {died[0]}
    else:
        assert "failed:" not in output and "rank 2 dies" not in output
    finals = re.findall(r"final (\w+): rank (\d) of 2 step (\d+) params (\w+) optimizer (\w+)", output)
    for method in METHODS:
        ours = [f for f in finals if f[0] == method]
        assert sorted(f[1] for f in ours) == ["0", "1"] and len({f[2:] for f in ours}) == 1, (method, finals)


@pytest.fixture
def keras_parts(tf_horovod):
    import keras

    import sparsecomm.tensorflow as sctf

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(3)])
    compression = sctf.TopK(  # every variable sparse (the 3-element bias's 1 row and marker are not smaller)
        ratio=0.25,
        exchange="allgather",
        variables=model.trainable_variables,
        min_numel=0,
        dense_1d=False,
        dense_fallback=False,
    )
    return model, keras.optimizers.SGD(0.1, momentum=0.9), compression


def test_the_state_builds_the_optimizer_and_restores_the_last_commit(keras_parts):
    import keras
    import numpy as np
    import tensorflow as tf

    from sparsecomm.tensorflow import keras as sckeras

    model, sgd, compression = keras_parts
    optimizer = sckeras.DistributedOptimizer(sgd, compression)
    state = sckeras.ElasticState(model, optimizer, compression, batch=0)
    assert optimizer.built and len(optimizer.variables) == 2 + 4  # iterations, learning rate, 4 momenta
    x, y = tf.random.stateless_normal([4, 8], [1, 2]), tf.constant([0, 1, 2, 0])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    state.sync()  # one rank: a no-op broadcast, then saved
    step()
    state.batch = 1
    state.commit()
    committed = [v.numpy().copy() for v in state.variables()] + compression.elastic_snapshot()
    step()
    state.batch = 2
    state.restore()
    assert state.batch == 1 and int(optimizer.iterations.numpy()) == 1
    for got, want in zip([v.numpy() for v in state.variables()] + compression.elastic_snapshot(), committed):
        np.testing.assert_array_equal(got, want)
    assert [int(s.step.numpy()) for s in compression.state] == [1, 1, 1, 1]


def test_the_state_names_the_wrong_argument(keras_parts):
    import keras

    from sparsecomm.tensorflow import keras as sckeras

    model, sgd, compression = keras_parts
    with pytest.raises(TypeError, match=r"model should be a Keras 3 model .*got builtins.dict"):
        sckeras.ElasticState({}, sgd)
    with pytest.raises(ValueError, match="model should be built"):
        sckeras.ElasticState(keras.Sequential([keras.layers.Dense(3)]), sgd)
    with pytest.raises(ValueError, match="optimizer is None and the model is not compiled"):
        sckeras.ElasticState(model)
    with pytest.raises(TypeError, match=r"optimizer should be a Keras 3 optimizer .*got builtins.str"):
        sckeras.ElasticState(model, "sgd")
    with pytest.raises(TypeError, match=r"compression should be a sparsecomm.tensorflow compressor .*builtins.str"):
        sckeras.ElasticState(model, sgd, "topk")
    with pytest.raises(TypeError, match=r"compression\[1\] should be .*NoneType"):
        sckeras.ElasticState(model, sgd, [compression, None])
    with pytest.raises(ValueError, match="lists a compressor twice"):
        sckeras.ElasticState(model, sgd, [compression, compression])
    with pytest.raises(ValueError, match=r"\['compressors', 'sync', 'variables'\] would hide"):
        sckeras.ElasticState(model, sgd, sync=1, compressors=2, variables=3, batch=0)
