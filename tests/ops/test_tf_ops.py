"""The TensorFlow op library against the same reference as the torch ops: same kernels,
so the bits must match exactly, for every dtype, in eager mode and inside tf.function."""

import os

import numpy as np
import pytest
import torch
from reference import block_start, random_block_pack, random_block_unpack

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
from sparsecomm.tensorflow import ops  # noqa: E402

PAIRS = [
    (torch.float32, tf.float32, torch.int32, tf.int32),
    (torch.float16, tf.float16, torch.int16, tf.int16),
    (torch.bfloat16, tf.bfloat16, torch.int16, tf.int16),
]
CASES = [(1000, 10, 100), (1000, 950, 100), (1000, 999, 1000), (1000, 17, 0), (1, 0, 1), (0, 0, 0), (4099, 4000, 333)]


def _bits_tf(t, int_dtype):
    return tf.bitcast(t, int_dtype).numpy()


def _bits_torch(t, int_dtype):
    return t.view(int_dtype).numpy()


def _to_tf(t, tf_dtype):
    return tf.cast(tf.constant(t.float().numpy()), tf_dtype)  # exact: every 16-bit value is a float32


@pytest.mark.parametrize("torch_dtype,tf_dtype,torch_int,tf_int", PAIRS)
@pytest.mark.parametrize("numel,start,length", CASES)
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_pack_and_unpack_match_reference(torch_dtype, tf_dtype, torch_int, tf_int, numel, start, length, graph):
    g = torch.Generator().manual_seed(numel + start)
    grad = torch.randn(numel, generator=g).to(torch_dtype)
    residual = torch.randn(numel, generator=g) * 0.1
    want_values, want_residual = random_block_pack(grad, residual, start, length)

    def step(grad_tf, residual_tf):
        values, residual_out = ops.block_pack(grad_tf, residual_tf, start, length)
        return values, residual_out, ops.block_unpack(values, numel, start, 0.5)

    run = tf.function(step) if graph else step
    values, residual_out, dense = run(_to_tf(grad, tf_dtype), tf.constant(residual.numpy()))
    assert values.dtype == tf_dtype and values.shape == (length,)
    np.testing.assert_array_equal(_bits_tf(values, tf_int), _bits_torch(want_values, torch_int))
    np.testing.assert_array_equal(residual_out.numpy().view(np.int32), want_residual.numpy().view(np.int32))
    np.testing.assert_array_equal(
        _bits_tf(dense, tf_int), _bits_torch(random_block_unpack(want_values, numel, start, 0.5), torch_int)
    )


def test_pack_without_error_feedback():
    grad = tf.range(10, dtype=tf.float32)
    values, residual_out = ops.block_pack(grad, None, 8, 4)
    np.testing.assert_array_equal(values.numpy(), [8, 9, 0, 1])
    assert residual_out.shape == (0,)


def test_random_block_start_matches_reference_and_torch_op():
    from sparsecomm.torch import ops as torch_ops

    for seed, tid, step, numel in [(0, 0, 0, 1), (42, 7, 3, 10), (2**64 - 1, 2**32 - 1, 2**33, 25_557_032)]:
        want = block_start(seed, tid, step, numel)
        assert int(ops.random_block_start(seed, tid, step, numel)) == want
        assert torch_ops.random_block_start(seed, tid, step, numel) == want


def test_bad_arguments_are_named():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"length should be in \[0, numel=10\], got 11"):
        ops.block_pack(tf.zeros(10), None, 0, 11)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"residual should have 10 elements like grad"):
        ops.block_pack(tf.zeros(10), tf.zeros(9), 0, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"start should be in \[0, numel=10\), got 10"):
        ops.block_unpack(tf.zeros(3), 10, 10)
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError, tf.errors.NotFoundError)):
        ops.block_pack(tf.zeros(10, tf.int32), None, 0, 1)


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_the_installed_self_test_passes_here_on_numpy_inputs(framework, capsys):
    """python -m sparsecomm.selftest (what sparsecomm.info and the quick check run from an install)
    hands the ops numpy arrays, not tensors: every check passes here too, so that a wrapper that
    takes only tensors fails this file, not only test_install.py's fresh environments."""
    from sparsecomm import selftest

    assert selftest.main(["--framework", framework]) == 0, capsys.readouterr().out
