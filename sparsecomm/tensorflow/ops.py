"""Typed wrappers of the TensorFlow ops in csrc/ (the op library built beside this file).

The same kernels as ``sparsecomm.torch.ops``: identical inputs give identical bits. TF ops
are functional: ``block_pack`` returns the updated residual instead of writing it in place.
"""
import glob
import os

import tensorflow as tf

from .._settings import sample_count, seed_as_int64, selected_count


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


# --- Selection with error feedback: the torch composites' mirror (sparsecomm/torch/ops.py) ---
# TF ops are functional: every pack returns (values, index, residual, momentum), the last two
# being the updated state (None where absent). Tensor sizes must be static.

def _flat(x):
    return tf.reshape(x, [-1])


def _numel(grad):
    numel = grad.shape.num_elements()
    if numel is None:
        raise ValueError(f"sparsecomm: the gradient's shape should be static, got {grad.shape}")
    return numel


def _state(x):
    return tf.zeros([0], tf.float32) if x is None else _flat(x)


def _given(out, state):
    return None if state is None else out


def _i64(x):
    return tf.cast(x, tf.int64)


def sample_threshold(grad, residual, ratio, *, momentum=None, momentum_factor=0.0, sample_ratio=0.01,
                     seed=0, tensor_id=0, step=0):
    """0-d float32 threshold that about `ratio` of a strided sample of |acc| passes."""
    return _lib.sparsecomm_sample_threshold(
        _flat(grad), _state(residual), _state(momentum), _i64(seed_as_int64(seed)), _i64(tensor_id), _i64(step),
        tf.constant(float(ratio), tf.float64), momentum_factor=float(momentum_factor),
        sample_count=sample_count(_numel(grad), ratio, sample_ratio))


def accumulate_candidates(grad, residual, threshold, *, momentum=None, momentum_factor=0.0):
    """(acc, index, residual, momentum): the state takes acc for every element; the candidates
    are the elements with |acc| >= threshold (NaN included), in index order."""
    acc, index, res, mom = _lib.sparsecomm_accumulate_candidates(
        _flat(grad), _state(residual), _state(momentum), tf.cast(threshold, tf.float32),
        momentum_factor=float(momentum_factor))
    return acc, index, _given(res, residual), _given(mom, momentum)


def select_top(acc, index, k):
    """The k candidates of largest |acc| (ties: lower index first), in index order."""
    return tuple(_lib.sparsecomm_select_top(acc, index, _i64(k)))


def send_selected(acc, index, residual, dtype, *, momentum=None, masking=True):
    """(values, residual, momentum): values in `dtype`; sent elements keep their rounding error."""
    values, res, mom = _lib.sparsecomm_send_selected(acc, index, _state(residual), _state(momentum), dtype=dtype,
                                                     masking=masking)
    return values, _given(res, residual), _given(mom, momentum)


def send_quantized(acc, index, residual, bits, *, momentum=None, masking=True):
    """(codes, scales, residual, momentum): 1-/2-bit codes with per-class scales."""
    codes, scales, res, mom = _lib.sparsecomm_send_quantized(acc, index, _state(residual), _state(momentum),
                                                             bits=int(bits), masking=masking)
    return codes, scales, _given(res, residual), _given(mom, momentum)


def dequantize(codes, scales, count, bits):
    return _lib.sparsecomm_dequantize(codes, scales, _i64(count), bits=int(bits))


def sparse_unpack(values, index, numel, scale=1.0):
    """Dense 1-D tensor: scale * (sum of the values at each index, in float32); duplicates add."""
    return _lib.sparsecomm_sparse_unpack(values, index, numel=int(numel), scale=float(scale))


def random_k_indices(numel, k, *, seed, tensor_id, step):
    """k distinct indices of [0, numel), sorted, int32; the torch op's stream."""
    return _lib.sparsecomm_random_k_indices(_i64(seed_as_int64(seed)), _i64(tensor_id), _i64(step), _i64(numel),
                                            _i64(k))


def _accumulated_state(grad, residual, momentum):
    return residual if residual is not None else momentum if momentum is not None else _flat(grad)


def pack_above(grad, residual, threshold, *, momentum=None, momentum_factor=0.0, masking=True):
    """Exactly the elements with |acc| >= threshold, in index order: one pass."""
    acc, index, residual, momentum = accumulate_candidates(grad, residual, threshold, momentum=momentum,
                                                           momentum_factor=momentum_factor)
    values, residual, momentum = send_selected(acc, index, residual, grad.dtype, momentum=momentum, masking=masking)
    return values, index, residual, momentum


def _top_candidates(grad, residual, k, *, momentum, momentum_factor, sample_ratio, seed, tensor_id, step):
    numel = _numel(grad)
    k = min(k, numel)
    if k == 0:
        threshold = float("inf")
    else:
        threshold = sample_threshold(grad, residual, min(1.0, (1.5 * k + 32) / numel), momentum=momentum,
                                     momentum_factor=momentum_factor, sample_ratio=sample_ratio, seed=seed,
                                     tensor_id=tensor_id, step=step)
    acc, index, residual, momentum = accumulate_candidates(grad, residual, threshold, momentum=momentum,
                                                           momentum_factor=momentum_factor)
    state = _accumulated_state(grad, residual, momentum)
    acc, index = tf.cond(tf.size(acc) < k,
                         lambda: accumulate_candidates(state, None, 0.0)[:2],  # sample overshot: every element
                         lambda: (acc, index))
    acc, index = select_top(acc, index, k)
    return acc, index, residual, momentum


def pack_topk(grad, residual, k, *, momentum=None, momentum_factor=0.0, masking=True, sample_ratio=0.01,
              seed=0, tensor_id=0, step=0):
    """Exactly the k elements of largest |acc| (ties: lower index), in index order."""
    acc, index, residual, momentum = _top_candidates(grad, residual, k, momentum=momentum,
                                                     momentum_factor=momentum_factor, sample_ratio=sample_ratio,
                                                     seed=seed, tensor_id=tensor_id, step=step)
    values, residual, momentum = send_selected(acc, index, residual, grad.dtype, momentum=momentum, masking=masking)
    return values, index, residual, momentum


def pack_sampled(grad, residual, ratio, *, band=(0.8, 1.3), momentum=None, momentum_factor=0.0, masking=True,
                 sample_ratio=0.01, seed=0, tensor_id=0, step=0, value_dtype=None, bits=None):
    """Sampled threshold with bounded correction into [band[0] k, band[1] k] (gradient dropping, DGC).
    Values in `value_dtype` (default grad's); with bits (1 or 2) the values are (codes, scales)."""
    numel = _numel(grad)
    k = selected_count(ratio, numel)
    if k >= numel:  # everything is sent: no estimate needed (and none could miss an element)
        threshold = 0.0
    else:
        threshold = sample_threshold(grad, residual, ratio, momentum=momentum, momentum_factor=momentum_factor,
                                     sample_ratio=sample_ratio, seed=seed, tensor_id=tensor_id, step=step)
    acc, index, residual, momentum = accumulate_candidates(grad, residual, threshold, momentum=momentum,
                                                           momentum_factor=momentum_factor)
    state = _accumulated_state(grad, residual, momentum)
    count = tf.cast(tf.size(acc), tf.float32)
    acc, index = tf.case([(count > band[1] * k, lambda: select_top(acc, index, k)),
                          (count < band[0] * k, lambda: select_top(*accumulate_candidates(state, None, 0.0)[:2], k))],
                         default=lambda: (acc, index))
    if bits is not None:
        codes, scales, residual, momentum = send_quantized(acc, index, residual, bits, momentum=momentum,
                                                           masking=masking)
        return (codes, scales), index, residual, momentum
    values, residual, momentum = send_selected(acc, index, residual, value_dtype or grad.dtype, momentum=momentum,
                                               masking=masking)
    return values, index, residual, momentum


def pack_indices(grad, residual, index, *, momentum=None, momentum_factor=0.0, masking=True):
    """The elements at `index` (int32, distinct, ascending): one pass, then an O(k) gather."""
    if residual is not None or momentum is not None:
        _, _, residual, momentum = accumulate_candidates(grad, residual, float("inf"), momentum=momentum,
                                                         momentum_factor=momentum_factor)
    acc = tf.cast(tf.gather(_accumulated_state(grad, residual, momentum), index), tf.float32)
    values, residual, momentum = send_selected(acc, index, residual, grad.dtype, momentum=momentum, masking=masking)
    return values, index, residual, momentum


def pack_randomk(grad, residual, k, *, seed, tensor_id, step, momentum=None, momentum_factor=0.0, masking=True):
    """Shared-seed random-k: the same k coordinates on every rank."""
    numel = _numel(grad)
    index = random_k_indices(numel, min(k, numel), seed=seed, tensor_id=tensor_id, step=step)
    return pack_indices(grad, residual, index, momentum=momentum, momentum_factor=momentum_factor, masking=masking)


def pack_rtopk(grad, residual, r, k, *, seed, tensor_id, step, momentum=None, momentum_factor=0.0, masking=True,
               sample_ratio=0.01):
    """rTop-k: k elements drawn with the shared-seed stream from the r of largest |acc|."""
    acc, index, residual, momentum = _top_candidates(grad, residual, max(r, k), momentum=momentum,
                                                     momentum_factor=momentum_factor, sample_ratio=sample_ratio,
                                                     seed=seed, tensor_id=tensor_id, step=step)
    pick = random_k_indices(tf.size(acc), tf.minimum(k, tf.size(acc)), seed=seed, tensor_id=tensor_id, step=step)
    acc, index = tf.gather(acc, pick), tf.gather(index, pick)
    values, residual, momentum = send_selected(acc, index, residual, grad.dtype, momentum=momentum, masking=masking)
    return values, index, residual, momentum
