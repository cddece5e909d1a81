"""Compressor state across ranks and restarts. Checkpoint -> restore -> continue gives the same
parameters as not stopping (2 ranks), bit for bit, for DGC (residual, momentum, warm-up step)
and RandomBlock (the seed stream's step); load_state_dict refuses a state that does not fit;
and settings or checkpoints that differ across ranks raise the same error on every rank."""

import common
import pytest
import torch
from launch import horovodrun

from sparsecomm.torch import DGC, TopK


@pytest.mark.parametrize("config", ["dgc", "random_block"])
def test_resumed_training_equals_uninterrupted_training(config, tmp_path_factory, request):
    out = tmp_path_factory.getbasetemp() / "checkpoint"
    if not (out / "rank1.pt").exists():
        out.mkdir(exist_ok=True)
        horovodrun(2, "torch_checkpoint.py", "--out", out)
    for rank in range(2):
        results = torch.load(out / f"rank{rank}.pt")
        straight, resumed = results[f"{config}/straight"], results[f"{config}/resumed"]
        for name in straight:
            assert torch.equal(straight[name], resumed[name]), (rank, name)
        assert not torch.equal(straight["0.weight"], common.torch_model()[0].weight)  # it trained


def test_load_state_dict_refuses_states_that_do_not_fit():
    model = common.torch_model()
    dgc = DGC(named_parameters=model.named_parameters())
    with pytest.raises(ValueError, match="the state was saved by 'TopK', not DGC"):
        dgc.load_state_dict(TopK(ratio=0.1, named_parameters=model.named_parameters()).state_dict())
    with pytest.raises(KeyError, match="the state has parameter 'other.weight', which is not among named_parameters"):
        dgc.load_state_dict({"compressor": "DGC", "parameters": {"other.weight": {"step": 1}}})
    with pytest.raises(ValueError, match="the saved residual of '0.weight' has 3 elements, the parameter 2048"):
        dgc.load_state_dict({"compressor": "DGC", "parameters": {"0.weight": {"step": 1, "residual": torch.zeros(3)}}})
    with pytest.raises(TypeError, match="load_state_dict expects what state_dict\\(\\) returned"):
        dgc.load_state_dict([1, 2])


def test_settings_or_checkpoints_that_differ_across_ranks_raise_the_same_error_everywhere():
    output = horovodrun(2, "torch_settings.py", timeout=180)
    assert output.count(": trained") == 2, output[-3000:]  # equal settings: both ranks train
    errors = [
        line for line in output.splitlines() if "ValueError: TopK: compressor settings differ across ranks" in line
    ]
    assert len(errors) == 2, output[-3000:]
    for line in errors:
        assert "ratio=0.1" in line and "ratio=0.2" in line and "rank 0:" in line and "rank 1:" in line
    # Checkpoints of different steps: RandomBlock would pick different blocks on each rank.
    for case, steps in (("mid-run", "rank 0: 2, rank 1: 4"), ("first step", "rank 0: 0, rank 1: 4")):
        errors = [
            line
            for line in output.splitlines()
            if f": {case}: ValueError: RandomBlock: the ranks' compressor "
            f"state differs: tensor '0.bias', step: {steps} (and 3 more "
            f"tensors)" in line
        ]
        assert len(errors) == 2, output[-3000:]
