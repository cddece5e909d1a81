"""Mixed precision (loss_scaler=) on 2 ranks, every method, one horovodrun launch
(tests/workers/torch_loss_scale.py): float32 training under a torch.amp.GradScaler whose
scale grows and, after a forced overflow on rank 1 only, backs off, against the same training
without a scaler and without the overflowed step. The scales are powers of two, so the two
must agree bit for bit: residuals and momenta follow the scale exactly, the overflowed step
leaves no trace in them or in the step counter, and the overflow reaches rank 0's scaler
whatever coordinates rank 1 sent. Also checkpoints taken with a rescale and a rollback pending,
and a bfloat16 autocast run."""

import common
import pytest
import torch
from cases import assert_same_params
from launch import horovodrun, saved_ranks

CONFIGS = ["dgc", "threshold_2bit", "topk_spardl", "rtopk", "randomk", "random_block"]
# the scale of each step: growth after 3 good steps, backoff after the overflow at step 4
SCALES = [2.0**10] * 3 + [2.0**11] * 2 + [2.0**10] * 3 + [2.0**11] * 2


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return saved_ranks(tmp_path_factory, horovodrun, 2, "torch_loss_scale.py", timeout=400)


@pytest.mark.parametrize("config", CONFIGS)
def test_an_overflowed_step_leaves_no_trace_and_residuals_follow_the_scale(results, config):
    initial = dict(common.torch_model().named_parameters())
    for rank in range(2):
        r = results[rank][config]
        assert r["scales"] == SCALES, (rank, r["scales"])  # it grew, backed off once (the overflow), grew again
        assert_same_params(r["scaled"], r["reference"], f"rank {rank}: scaled vs unscaled without the overflowed step")
        assert r["steps"] == r["reference_steps"] == {n: 9 for n in initial}  # the overflowed step rolled back
        assert set(r["loss_scales"].values()) == {SCALES[-1]}
        assert not torch.equal(r["scaled"]["0.weight"], initial["0.weight"])  # it trained
    assert_same_params(results[1][config]["scaled"], results[0][config]["scaled"], "rank 1 vs rank 0")


@pytest.mark.parametrize("config", CONFIGS)
def test_a_checkpoint_with_a_rescale_or_rollback_pending_resumes_exactly(results, config):
    for rank in range(2):
        r = results[rank][config]
        assert_same_params(r["resumed"], r["scaled"], f"rank {rank}: resumed vs straight")


@pytest.mark.parametrize("config", CONFIGS)
def test_bfloat16_autocast_trains_with_finite_state(results, config):
    for rank in range(2):
        r = results[rank][config]
        losses = r["bf16_losses"]  # 40 steps; rank 1 overflows at step 4 here too
        assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses  # it falls (ln 10 = 2.30 at the start)
        assert r["bf16_finite"]
