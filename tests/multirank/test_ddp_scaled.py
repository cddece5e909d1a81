"""ddp_hook with a torch.amp.GradScaler and across a torchrun restart, every method of
common.loss_scale_configs, on 2 ranks (tests/workers/ddp_scaled.py, two launches): the scaled
run with a forced overflow on rank 1 against the same run without a scaler and without the
overflowed step (the scales are powers of two: bit for bit), and a run stopped after the
overflow (a rollback pending; the first launch's third run), restarted by a new torchrun and
resumed from each rank's checkpoint against the run that did not stop."""

import common
import pytest
import torch
from cases import assert_same_params
from launch import torchrun

CONFIGS = ["dgc", "threshold_2bit", "topk_spardl", "rtopk", "randomk", "random_block"]
# the scale of each step: growth after 3 good steps, backoff after the overflow at step 4
SCALES = [2.0**10] * 3 + [2.0**11] * 2 + [2.0**10] * 3 + [2.0**11] * 2
SIZE = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp_scaled")
    for mode in ("straight", "resume"):
        torchrun(SIZE, "ddp_scaled.py", "--out", out, "--mode", mode)
    return {mode: [torch.load(out / f"{mode}{r}.pt") for r in range(SIZE)] for mode in ("straight", "resume")}


@pytest.mark.parametrize("config", CONFIGS)
def test_an_overflowed_step_leaves_no_trace(runs, config):
    initial = dict(common.torch_model().named_parameters())
    for rank in range(SIZE):
        run = runs["straight"][rank][config]
        assert run["scales"] == SCALES, (rank, run["scales"])  # it grew, backed off once, grew again
        assert_same_params(run["params"], run["reference"]["params"], f"rank {rank}: scaled vs unscaled")
        assert run["steps"] == run["reference"]["steps"] == {n: 9 for n in initial}  # the overflow rolled back
        assert not torch.equal(run["params"]["0.weight"], initial["0.weight"])  # it trained
    assert_same_params(runs["straight"][1][config]["params"], runs["straight"][0][config]["params"], "rank 1 vs 0")


@pytest.mark.parametrize("config", CONFIGS)
def test_a_torchrun_restart_resumes_bitwise(runs, config):
    for rank in range(SIZE):
        straight, resumed = runs["straight"][rank][config], runs["resume"][rank][config]
        assert_same_params(resumed["params"], straight["params"], f"rank {rank}: resumed vs straight")
        assert resumed["scales"] == SCALES[-len(resumed["scales"]) :]
        assert resumed["steps"] == straight["steps"]
