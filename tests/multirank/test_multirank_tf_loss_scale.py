"""Mixed precision with the TensorFlow compressors (loss_scaler= a Keras 3 LossScaleOptimizer)
on 2 ranks, every method, one horovodrun launch (tests/workers/tf_loss_scale.py): float32
training with hvd.DistributedGradientTape in tf.function, whose scale grows and, after a forced
overflow on rank 1 only, backs off, against the same training with plain SGD and without the
overflowed step, bit for bit; checkpoints (tf.train.Checkpoint) taken with a rescale and a
rollback pending; model.fit under mixed_bfloat16 through sparsecomm's Keras 3 wrapper."""

import numpy as np
import pytest
from launch import horovodrun, saved_ranks

CONFIGS = ["dgc", "threshold_2bit", "topk_spardl", "rtopk", "randomk", "random_block"]
RESUMED = ["dgc", "randomk"]
SCALES = [2.0**10] * 3 + [2.0**11] * 2 + [2.0**10] * 3 + [2.0**11] * 2


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return saved_ranks(tmp_path_factory, horovodrun, 2, "tf_loss_scale.py", timeout=500)


def _assert_bitwise(r, got, want, config, what):
    for i in range(4):
        a, b = r[f"{config}/{got}/{i}"], r[f"{config}/{want}/{i}"]
        assert np.array_equal(a, b), f"{what}: variable {i} differs by up to {np.abs(a - b).max():.3g}"


@pytest.mark.parametrize("config", CONFIGS)
def test_an_overflowed_step_leaves_no_trace_and_residuals_follow_the_scale(results, config):
    for rank, r in enumerate(results):
        assert r[f"{config}/scales"].tolist() == SCALES, rank
        _assert_bitwise(
            r, "scaled", "reference", config, f"rank {rank}: scaled vs unscaled without the overflowed step"
        )
        assert r[f"{config}/steps"].tolist() == r[f"{config}/reference_steps"].tolist() == [9] * 4
        assert r[f"{config}/loss_scales"].tolist() == [SCALES[-1]] * 4
        assert not np.array_equal(r[f"{config}/scaled/0"], r["initial/0"])  # it trained
    for i in range(4):
        assert np.array_equal(results[0][f"{config}/scaled/{i}"], results[1][f"{config}/scaled/{i}"]), i


@pytest.mark.parametrize("config", RESUMED)
def test_a_checkpoint_with_a_rescale_or_rollback_pending_resumes_exactly(results, config):
    for rank, r in enumerate(results):
        _assert_bitwise(r, "resumed", "scaled", config, f"rank {rank}: resumed vs straight")


def test_model_fit_under_mixed_bfloat16_follows_the_wrapped_optimizer(results):
    for r in results:
        assert bool(r["fit/follows_the_wrapper"])  # the compressor reads the scale of the optimizer fit uses
        losses = r["fit/losses"]
        assert losses[-1] < 0.3 * losses[0], losses
        assert bool(r["fit/finite"])
        assert r["fit/loss_scale"].tolist() == [float(r["fit/optimizer_scale"])] * 4
