"""Mixed precision for the TF compressors (``loss_scaler=``, a Keras 3 LossScaleOptimizer): the
scale read in the graph and the overflow every rank must see. Each variable's state follows
the scale in the graph (state.VariableState.follow_loss_scale, by sparsecomm.core.loss_scale)."""

import dataclasses

import tensorflow as tf

from ..core import loss_scale


def checked_scaler(owner, scaler):
    """loss_scaler=: None or a Keras 3 LossScaleOptimizer (its factors are fixed: 2 and 1/2)."""
    if scaler is None:
        return None
    import keras

    loss_scale.check_type(owner, scaler, keras.optimizers.LossScaleOptimizer, "keras.optimizers.LossScaleOptimizer")
    loss_scale.check_factors(owner, 0.5, 2.0)  # LossScaleOptimizer's own, fixed
    return scaler


def current_scale(owner, scaler):
    """The scaler's current scale, read in the graph (its variable)."""
    if not scaler.built:
        raise RuntimeError(
            f"{owner}: the loss_scaler (LossScaleOptimizer) is not built: call "
            f"optimizer.build(model.trainable_variables) before the first step"
        )
    return tf.convert_to_tensor(scaler.dynamic_scale.value)


def nan_first(packed, overflow):
    """A payload whose gradient held an inf or NaN (`overflow`, a bool tensor) starts with a NaN
    (quantized: every scale is NaN), so every rank's scaler sees it whatever coordinates were picked."""
    nan = float("nan")
    if packed.bits is not None:
        return dataclasses.replace(
            packed, scales=tf.where(overflow, tf.fill(tf.shape(packed.scales), nan), packed.scales)
        )
    values = tf.reshape(packed.values, [-1])
    first = tf.where(overflow, tf.constant(nan, values.dtype), values[:1])
    return dataclasses.replace(packed, values=tf.concat([first, values[1:]], 0))
