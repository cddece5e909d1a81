"""Every compressor on 2 and 3 ranks (one horovodrun -np 3, the 2 ranks a process set of it)
with stock hvd.DistributedOptimizer (tests/workers/torch_train.py, 26 configurations: each
method and its options, DGC's warm-up, clipping and policy, dense with and without momentum),
each rank against a single-process simulation of the N ranks (simulated_training.py), and the
ranks against each other bit for bit."""

import common
import pytest
import torch
from launch import sizes_fixture
from simulated_training import LR, SIMULATIONS, STEPS, assert_history_close, assert_ranks_close, simulated

run = sizes_fixture("torch_train.py", "--steps", STEPS, "--lr", LR)


@pytest.mark.parametrize("config", list(SIMULATIONS))
def test_every_rank_equals_the_simulation(run, config):
    size, ranks = run
    assert_ranks_close([r[config] for r in ranks], simulated(size, config), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config", common.ONE_BY_ONE)
def test_tensors_prepared_in_groups_train_as_one_by_one(run, config):
    """From the second step the compressor prepares the MLP's 4 tensors as one group (one pack op):
    the same parameters at every step, bit for bit, as with each tensor prepared alone."""
    _, ranks = run
    for rank in ranks:
        assert (rank[f"grouped/{config}"], rank[f"grouped/{config}_one_by_one"]) == (4, 1)
        assert_history_close(rank[config], rank[f"{config}_one_by_one"], rtol=0, atol=0)


def test_sparse_training_actually_moved_every_parameter(run):
    """Guards against a vacuous pass: the compressed run updates parameters, and differs from dense."""
    _, ranks = run
    initial = dict(common.torch_model().named_parameters())
    dense = ranks[0]["dense"][-1]
    for config in (
        "random_block_0.1",
        "topk_0.1",
        "topk_0.1_sum",
        "randomk_0.1",
        "rtopk_0.1",
        "threshold_0.1",
        "dgc_0.1",
    ):
        sparse = ranks[0][config][-1]
        for name, p in initial.items():
            assert not torch.equal(sparse[name], p.detach()), (config, name)
            assert not torch.equal(sparse[name], dense[name]), (config, name)


@pytest.mark.parametrize("config", ["random_block_1.0", "topk_1.0", "randomk_1.0", "rtopk_1.0", "threshold_1.0"])
def test_ratio_one_equals_dense_allreduce(run, config):
    size, ranks = run
    tol = dict(rtol=0, atol=0) if size == 2 else dict(rtol=1e-6, atol=1e-7)  # 3 ranks: Gloo's chunked sum order
    assert_history_close(ranks[0][config], ranks[0]["dense"], **tol)


def test_dgc_at_ratio_one_without_masking_is_momentum_sgd(run):
    """The paper's equivalence: momentum in DGC + plain SGD == dense momentum SGD."""
    _, ranks = run
    assert_history_close(ranks[0]["dgc_1.0_no_masking"], ranks[0]["dense_momentum"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config", ["random_block_0.1", "randomk_0.1"])
def test_shared_coordinates_count_what_the_ring_allreduce_receives(run, config):
    """Shared coordinates ride Horovod's ring allreduce: each rank receives 2 (N-1)/N of the
    values it hands it, per tensor and step (stats() counted none before)."""
    size, ranks = run
    for rank in ranks:
        for name, t in rank[f"stats/{config}"]["tensors"].items():
            per_step = t["sent_bytes"] // STEPS
            assert per_step > 0 and t["received_bytes"] == STEPS * (2 * (size - 1) * per_step // size), name
