"""Typed wrappers of the TensorFlow ops in csrc/ (the op library built beside this file).

The same kernels as ``sparsecomm.torch.ops``: identical inputs give identical bits. TF ops
are functional: ``block_pack`` returns the updated residual instead of writing it in place.
"""

import glob
import os

import tensorflow as tf

from .. import build_info
from ..core import packing
from ..core.selection import sample_count, seed_as_int64


def _load():
    """The op library, after checking it was built for this TensorFlow and CPU."""
    build_info.require("tensorflow", tf.__version__)
    found = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ops*.so")))
    if not found:
        raise build_info.BuildMismatch(
            "sparsecomm's TensorFlow op library is missing; rebuild with:\n    " + build_info.rebuild_command()
        )
    return tf.load_op_library(found[0])


_lib = _load()


def random_block_start(seed, tensor_id, step, numel):
    """Start (int64 scalar) of the cyclic random block; same stream as the torch op."""
    as_int64 = lambda x: tf.cast(x, tf.int64)  # noqa: E731
    return _lib.sparsecomm_random_block_start(
        as_int64(seed_as_int64(seed)), as_int64(tensor_id), as_int64(step), as_int64(numel)
    )


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


# --- Selection with error feedback (the torch ops' twins) ------------------------------------
# TF ops are functional: each returns the updated state (None where absent). Tensor sizes
# must be static.


def _flat(x):
    """x (a tensor or an array) as a 1-D tensor: a 1-D tensor as it is, with no op."""
    return x if isinstance(x, (tf.Tensor, tf.Variable)) and x.shape.rank == 1 else tf.reshape(x, [-1])


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
    return tf.constant(x, tf.int64) if isinstance(x, int) else tf.cast(x, tf.int64)


def sample_threshold(
    grad,
    residual,
    ratio,
    *,
    momentum=None,
    momentum_factor=0.0,
    sample_ratio=0.01,
    seed=0,
    tensor_id=0,
    step=0,
    grad_scale=None,
    nesterov=False,
):
    """0-d float32 threshold that about `ratio` of a strided sample of |acc| passes. grad_scale
    (a float32 scalar, or None): grad is read times it, rounded once to its dtype, as if scaled
    first (DGC's clipping factor). nesterov: as sparsecomm.torch.ops'."""
    return _lib.sparsecomm_sample_threshold(
        _flat(grad),
        _state(residual),
        _state(momentum),
        _i64(seed_as_int64(seed)),
        _i64(tensor_id),
        _i64(step),
        tf.constant(float(ratio), tf.float64),
        _state(grad_scale),
        momentum_factor=float(momentum_factor),
        nesterov=bool(nesterov),
        sample_count=sample_count(_numel(grad), ratio, sample_ratio),
    )


def accumulate_candidates(
    grad, residual, threshold, *, momentum=None, momentum_factor=0.0, grad_scale=None, nesterov=False
):
    """(acc, index, residual, momentum): the state takes acc for every element; the candidates
    are the elements with |acc| >= threshold (NaN included), in index order. grad_scale: as
    sample_threshold's (it needs a residual or a momentum)."""
    acc, index, res, mom = _lib.sparsecomm_accumulate_candidates(
        _flat(grad),
        _state(residual),
        _state(momentum),
        tf.cast(threshold, tf.float32),
        _state(grad_scale),
        momentum_factor=float(momentum_factor),
        nesterov=bool(nesterov),
    )
    return acc, index, _given(res, residual), _given(mom, momentum)


def accumulate(grad, residual, *, momentum=None, momentum_factor=0.0):
    """(residual, momentum): accumulate_candidates with nothing selected, one pass; no output
    depends on the data, so a GPU need not be waited for."""
    res, mom = _lib.sparsecomm_accumulate(
        _flat(grad), _state(residual), _state(momentum), momentum_factor=float(momentum_factor)
    )
    return _given(res, residual), _given(mom, momentum)


def momentum_step(grad, momentum, momentum_factor, *, grad_scale=None, nesterov=False):
    """(payload, momentum): DGC's dense route in one pass. momentum_factor * momentum + grad is
    the new momentum (float32, flat) and, rounded to grad's dtype, the payload (grad's shape);
    with nesterov, momentum_factor * (momentum + grad) and that + grad. grad_scale: as
    sample_threshold's."""
    return tuple(
        _lib.sparsecomm_momentum_step(
            grad,
            _flat(momentum),
            _state(grad_scale),
            momentum_factor=float(momentum_factor),
            nesterov=bool(nesterov),
        )
    )


def sum_of_squares(x):
    """The sum of the squares of x (float32, float16 or bfloat16) as a float64 scalar: one read,
    no float32 copy, the torch op's bits (a fixed order of addition, csrc/kernels/squares.h)."""
    return _lib.sparsecomm_sum_of_squares(x)


def select_top(acc, index, k):
    """The k candidates of largest |acc| (ties: lower index first), in index order."""
    return tuple(_lib.sparsecomm_select_top(acc, index, _i64(k)))


def select_band(acc, index, every, k, too_few, too_many):
    """A selection brought into its band in one op: fewer than too_few candidates, the top k of
    every element of `every` (the tensor holding each element's acc); more than too_many, the
    top k of the candidates; else the candidates as they are (sparsecomm.core.packing.Plan)."""
    band = dict(k=int(k), too_few=int(too_few), too_many=int(too_many))
    return tuple(_lib.sparsecomm_select_band(acc, index, _flat(every), **band))


def send_selected(acc, index, residual, dtype, *, momentum=None, masking=True):
    """(values, residual, momentum): values in `dtype`; sent elements keep their rounding error."""
    values, res, mom = _lib.sparsecomm_send_selected(
        acc, index, _state(residual), _state(momentum), dtype=dtype, masking=masking
    )
    return values, _given(res, residual), _given(mom, momentum)


def send_quantized(acc, index, residual, bits, *, momentum=None, masking=True):
    """(codes, scales, residual, momentum): 1-/2-bit codes with per-class scales."""
    codes, scales, res, mom = _lib.sparsecomm_send_quantized(
        acc, index, _state(residual), _state(momentum), bits=int(bits), masking=masking
    )
    return codes, scales, _given(res, residual), _given(mom, momentum)


def dequantize(codes, scales, count, bits):
    return _lib.sparsecomm_dequantize(codes, scales, _i64(count), bits=int(bits))


def quantized_segment(codes, scales, index, bits, numel):
    """One rank's 1-/2-bit segment of sparsecomm.core.wire (uint8, 1-D) of a tensor of `numel`:
    send_quantized's codes and scales at `index` (int32, strictly ascending); the torch op's bytes."""
    return _lib.sparsecomm_quantized_segment(codes, scales, index, bits=int(bits), numel=int(numel))


def segment_columns(gathered, bits, ranks, numel):
    """(values float32, index int32) of `ranks` segments of quantized_segment gathered one after
    another: each rank's codes decoded with its scales, in rank order."""
    return tuple(_lib.sparsecomm_segment_columns(gathered, bits=int(bits), ranks=int(ranks), numel=int(numel)))


def sparse_unpack(values, index, numel, scale=1.0, divisor=1):
    """Dense 1-D tensor in values' dtype: scale / divisor * (sum of the values at each index, in
    float32; duplicates add), rounded once. `scale` may be a 1-element float32 tensor (Horovod's
    reduced placeholder): the kernel reads it where it runs, so a GPU is not waited for."""
    if not isinstance(scale, (tf.Tensor, tf.Variable)):
        scale = tf.constant([scale], tf.float32)
    return _lib.sparsecomm_sparse_unpack(values, index, tf.reshape(scale, [-1]), numel=int(numel), divisor=int(divisor))


def checked_scale(reduced, ranks, first, refusal):
    """The op's scale (1 element) of Horovod's reduced placeholder, core.placement's marker,
    checked to come from exactly `ranks` ranks whose first is `first`; the step fails with
    `refusal` otherwise (InvalidArgumentError)."""
    return _lib.sparsecomm_checked_scale(reduced, ranks=int(ranks), first=int(first), refusal=refusal)


def wire_rows(values, index, start, length):
    """The wire rows of sparsecomm.core.wire of a send of [start, start + length) (index int32,
    strictly ascending in it): uint8 [k + buckets, 2 + value bytes]; the torch op's bytes."""
    return _lib.sparsecomm_wire_rows(values, index, start=int(start), length=int(length))


def wire_columns(rows, value_dtype):
    """(values, index int32) of wire rows whose values are `value_dtype` (any sends, one after
    another), in order, the marker rows dropped."""
    return tuple(_lib.sparsecomm_wire_columns(rows, T=value_dtype))


def random_k_indices(numel, k, *, seed, tensor_id, step):
    """k distinct indices of [0, numel), sorted, int32; the torch op's stream."""
    return _lib.sparsecomm_random_k_indices(
        _i64(seed_as_int64(seed)), _i64(tensor_id), _i64(step), _i64(numel), _i64(k)
    )


class _Kernels:
    """These ops as sparsecomm.core.packing uses them."""

    sample_threshold = staticmethod(sample_threshold)
    accumulate_candidates = staticmethod(accumulate_candidates)
    accumulate = staticmethod(accumulate)
    select_band = staticmethod(select_band)
    send_selected = staticmethod(send_selected)
    send_quantized = staticmethod(send_quantized)

    @staticmethod
    def random_k_indices(like, k, *, seed, tensor_id, step):  # at most every element of `like`
        numel = like.shape.num_elements()
        if numel is None:
            numel = tf.size(like)
            return random_k_indices(numel, tf.minimum(k, numel), seed=seed, tensor_id=tensor_id, step=step)
        return random_k_indices(numel, min(k, numel), seed=seed, tensor_id=tensor_id, step=step)

    numel = staticmethod(_numel)
    dtype = staticmethod(lambda t: t.dtype)
    gather = staticmethod(tf.gather)
    gather_float = staticmethod(lambda x, index: tf.cast(tf.gather(_flat(x), index), tf.float32))


KERNELS = _Kernels()


# The error-feedback packs of sparsecomm.core.packing on these kernels.
pack_above, pack_topk, pack_rtopk, pack_indices, pack_randomk, pack_sampled = packing.bound(KERNELS)
