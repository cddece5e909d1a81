"""Mixed precision with the TensorFlow compressors in one process (no Horovod collectives):
loss_scaler= (a Keras 3 LossScaleOptimizer) checks, the rule of sparsecomm/core/loss_scale.py
applied in the graph (rollback, rescale, step) eagerly and in tf.function, NaN first in the
payload of a non-finite gradient, and the checkpointed loss-scale variables. Training on 2
ranks: test_multirank_tf_loss_scale.py."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
from common import EVERY  # noqa: E402

from sparsecomm.core.exchange import Packed  # noqa: E402
from sparsecomm.tensorflow import DGC, RandomBlock, RandomK, TopK  # noqa: E402
from sparsecomm.tensorflow.loss_scaling import nan_first  # noqa: E402


def _scaler(scale=16.0, variables=None):
    scaler = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=scale)
    if variables is not None:
        scaler.build(variables)
    return scaler


def test_loss_scaler_must_be_a_loss_scale_optimizer():
    w = tf.Variable(tf.zeros([4, 4]))
    with pytest.raises(
        TypeError,
        match="TopK: loss_scaler should be None or the keras.optimizers.LossScaleOptimizer "
        "that scales the loss, got SGD",
    ):
        TopK(ratio=0.1, variables=[w], loss_scaler=keras.optimizers.SGD(0.1))
    comp = RandomBlock(ratio=0.5, variables=[("w", w)], loss_scaler=_scaler(), **EVERY)  # not built yet
    with pytest.raises(
        RuntimeError,
        match=r"RandomBlock: the loss_scaler \(LossScaleOptimizer\) is not built: call "
        r"optimizer.build\(model.trainable_variables\)",
    ):
        comp.compress(tf.ones([4, 4]))


@pytest.mark.parametrize("make", [RandomBlock, RandomK])
@pytest.mark.parametrize("traced", [False, True])
def test_scaled_steps_with_an_overflow_equal_unscaled_steps_without_it(make, traced):
    """Scales 16, 16, 32 (growth), 32 (overflow on one element), 16, 16: the results divided by
    the scale, the residual and the step equal those of unscaled steps 0, 1, 2, 4, 5."""
    w = tf.Variable(tf.zeros([40, 30]))
    scaler = _scaler(variables=[w])
    scaled = make(ratio=0.2, seed=3, variables=[("w", w)], loss_scaler=scaler, **EVERY)
    plain = make(ratio=0.2, seed=3, variables=[("w", w)], **EVERY)
    run_scaled, run_plain = (
        (lambda g: scaled.decompress(*scaled.compress(g))),
        (lambda g: plain.decompress(*plain.compress(g))),
    )
    if traced:
        run_scaled, run_plain = tf.function(run_scaled), tf.function(run_plain)
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((40, 30)).astype(np.float32) for _ in range(6)]
    scales, overflow, got = [16.0, 16.0, 32.0, 32.0, 16.0, 16.0], 3, {}
    for step, scale in enumerate(scales):
        scaler.dynamic_scale.assign(scale)
        grad = grads[step] * scale
        if step == overflow:
            grad[7, 3] = np.inf
        got[step] = run_scaled(tf.constant(grad)).numpy() / scale
    assert not np.isfinite(got[overflow]).all()
    for step in (0, 1, 2, 4, 5):
        np.testing.assert_array_equal(got[step], run_plain(tf.constant(grads[step])).numpy())
    state, want = scaled.state[0], plain.state[0]
    assert int(state.step.numpy()) == int(want.step.numpy()) == 5
    np.testing.assert_array_equal(state.residual.numpy() / scales[-1], want.residual.numpy())


def test_a_non_finite_gradient_sends_anan_first():
    values = tf.constant([1.0, -2.0, 3.0], tf.bfloat16)
    assert np.isnan(nan_first(Packed(values), tf.constant(True)).values.numpy().astype(np.float32)[0])
    np.testing.assert_array_equal(nan_first(Packed(values), tf.constant(False)).values.numpy(), values.numpy())
    quantized = Packed(codes=tf.constant([1], tf.uint8), scales=tf.constant([0.5, 0.25]), bits=1)
    assert np.isnan(nan_first(quantized, tf.constant(True)).scales.numpy()).all()
    np.testing.assert_array_equal(nan_first(quantized, tf.constant(False)).scales.numpy(), [0.5, 0.25])


def test_the_loss_scale_and_the_backup_are_checkpointed(tmp_path):
    w = tf.Variable(tf.zeros([40, 40]))
    comp = DGC(ratio=0.1, variables=[("w", w)], loss_scaler=_scaler(variables=[w]), **EVERY)
    comp.state[0].loss_scale.assign(1024.0)
    comp.state[0].backup_momentum.assign(tf.fill([1600], 3.0))
    comp.state[0].backup_valid.assign(True)
    path = tf.train.Checkpoint(compression=comp).save(str(tmp_path / "c"))
    keys = {name for name, _ in tf.train.list_variables(path)}
    for key in ("loss_scale", "backup_step", "backup_valid", "backup_residual", "backup_momentum"):
        assert f"compression/state/0/{key}/.ATTRIBUTES/VARIABLE_VALUE" in keys
    fresh = DGC(ratio=0.1, variables=[("w", w)], loss_scaler=_scaler(variables=[w]), **EVERY)
    tf.train.Checkpoint(compression=fresh).restore(path).assert_consumed()
    state = fresh.state[0]
    assert float(state.loss_scale.numpy()) == 1024.0 and bool(state.backup_valid.numpy())
    assert float(state.backup_momentum.numpy()[7]) == 3.0
    assert not hasattr(DGC(ratio=0.1, variables=[("w", w)]).state[0], "loss_scale")  # nothing without a scaler
