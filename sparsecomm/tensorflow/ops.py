"""Typed wrappers of the TensorFlow ops in csrc/ (the op library built beside this file).

The same kernels as ``sparsecomm.torch.ops``: identical inputs give identical bits. TF ops
are functional: ``block_pack`` returns the updated residual instead of writing it in place.
"""
import glob
import os

import tensorflow as tf

from .._settings import seed_as_int64


def _load():
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_ops*.so")))
    if not found:
        raise ImportError(f"sparsecomm's TensorFlow op library is not built (no _ops*.so in {here}); "
                          f"run `make build` (or pip install -e . with TensorFlow installed)")
    return tf.load_op_library(found[0])


_lib = _load()


def random_block_start(seed, tensor_id, step, numel):
    """Start (int64 scalar) of the cyclic random block; same stream as the torch op."""
    as_int64 = lambda x: tf.cast(x, tf.int64)  # noqa: E731
    return _lib.sparsecomm_random_block_start(as_int64(seed_as_int64(seed)), as_int64(tensor_id),
                                              as_int64(step), as_int64(numel))


def block_pack(grad, residual, start, length):
    """Returns ``(values, residual_out)``; ``residual=None`` means no error feedback."""
    grad = tf.reshape(grad, [-1])
    if residual is None:
        residual = tf.zeros([0], tf.float32)
    values, residual_out = _lib.sparsecomm_block_pack(grad, residual, tf.cast(start, tf.int64), length=int(length))
    return values, residual_out


def block_unpack(values, numel, start, scale=1.0):
    """Dense 1-D tensor of ``numel`` elements: ``scale * values`` in the block, zero elsewhere."""
    return _lib.sparsecomm_block_unpack(values, tf.cast(start, tf.int64), numel=int(numel), scale=float(scale))
