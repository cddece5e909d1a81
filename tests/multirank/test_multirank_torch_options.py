"""hvd.DistributedOptimizer's options with sparsecomm compressors on 2 and 3 ranks (one
horovodrun -np 3, the 2 ranks a process set of it), against the plain-torch simulation of
test_multirank_torch.py."""

import common
import pytest
import torch
from launch import horovodrun, sizes_fixture
from simulated_training import assert_history_close, assert_ranks_close, simulate

STEPS, LR = 4, 0.5
SIMULATIONS = {
    "topk_passes2": dict(method="topk", ratio=0.1, passes=2),
    "topk_groups2": dict(method="topk", ratio=0.1),
    "block_groups2": dict(method="random_block", ratio=0.1, seed=3),
    "topk_keep_grads": dict(method="topk", ratio=0.1),
    "topk_spare": dict(method="topk", ratio=0.1, make_model=common.torch_model_with_spare),
    "topk_fp16": dict(method="topk", ratio=0.1, dtype=torch.float16),
    "topk_sparse_as_dense": dict(method="topk", ratio=0.1, make_model=common.torch_bag_model),
}


run = sizes_fixture("torch_options.py", "--steps", STEPS, "--lr", LR)


@pytest.mark.parametrize("config", list(SIMULATIONS))
def test_every_rank_equals_the_simulation(run, config):
    size, ranks = run
    want = simulate(size, steps=STEPS, lr=LR, **SIMULATIONS[config])
    # fp16 parameters: the simulation's float32 sums round differently by one fp16 unit at most
    tol = dict(rtol=2e-3, atol=2e-3) if config == "topk_fp16" else dict(rtol=1e-5, atol=1e-6)
    assert_ranks_close([r[config] for r in ranks], want, **tol)


def test_the_parameter_without_gradient_never_moves(run):
    _, ranks = run
    spare = common.torch_model_with_spare().spare.weight.detach()
    for step in ranks[0]["topk_spare"]:
        assert torch.equal(step["spare.weight"], spare)


def test_fp16_training_keeps_fp16_parameters(run):
    _, ranks = run
    assert all(t.dtype == torch.float16 for t in ranks[0]["topk_fp16"][-1].values())


def process_set_run(tmp_path_factory):
    """torch_process_set.py's folder of saved ranks and its output, launched once per worker."""
    out = tmp_path_factory.getbasetemp() / "process_set"
    if not (out / "output.txt").exists():
        out.mkdir(exist_ok=True)
        (out / "output.txt").write_text(horovodrun(3, "torch_process_set.py", "--out", out, "--steps", STEPS))
    return out, (out / "output.txt").read_text()


@pytest.mark.parametrize(
    "config,simulation",
    [("topk", dict(method="topk", ratio=0.1)), ("random_block", dict(method="random_block", ratio=0.1, seed=3))],
)
def test_a_process_set_of_two_among_three_ranks_equals_two_ranks(config, simulation, tmp_path_factory):
    out, output = process_set_run(tmp_path_factory)
    assert "rank 2: outside the process set" in output
    assert not (out / "rank2.pt").exists()
    want = simulate(2, steps=STEPS, lr=LR, **simulation)
    for rank in range(2):
        assert_history_close(torch.load(out / f"rank{rank}.pt")[config], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mismatch", ["optimizer_only", "compressor_only"])
def test_a_process_set_given_to_only_one_of_optimizer_and_compressor_is_refused_on_every_rank(
    mismatch, tmp_path_factory
):
    # The pair and rank 2 alone: given to the optimizer only, the compressors' gathers join
    # across the sets; to the compressor only, each set averages alone. Both silently wrong.
    _, output = process_set_run(tmp_path_factory)
    for rank in range(3):
        assert f"rank {rank}: {mismatch} refused: TopK: Horovod reduced the compressor's placeholder" in output, output
