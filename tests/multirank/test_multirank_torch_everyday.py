"""Everyday torch models under horovodrun -np 2 with every compressor: a parameter tied
between two modules, frozen parameters, and a branch whose parameters get no gradient on some
steps and ranks (common.torch_everyday_model), against the plain-torch simulation of
test_multirank_torch.py."""

import common
import pytest
import torch
from launch import horovodrun, saved_ranks
from simulated_training import simulate, simulate_dgc

STEPS, LR, SIZE = 6, 0.5, 2
METHODS = {
    "topk": dict(method="topk"),
    "rtopk": dict(method="rtopk_0.3"),
    "threshold": dict(method="threshold"),
    "dgc": None,
    "randomk": dict(method="randomk"),
    "random_block": dict(method="random_block"),
}
CONFIGS = [f"{method}/{variant}" for method in METHODS for variant in ("default", "zeroed,listed_twice")]


def _forward(model, x, step, rank):
    return model(x, branch=common.uses_branch(step, rank))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return saved_ranks(tmp_path_factory, horovodrun, SIZE, "torch_everyday.py", "--steps", STEPS, "--lr", LR)


@pytest.mark.parametrize("config", CONFIGS)
def test_every_rank_equals_the_simulation(ranks, config):
    settings = METHODS[config.split("/")[0]]
    common_args = dict(steps=STEPS, lr=LR, make_model=common.torch_everyday_model, forward=_forward)
    want = (
        simulate_dgc(SIZE, 0.1, **common_args)
        if settings is None
        else simulate(SIZE, ratio=0.1, seed=7, **settings, **common_args)
    )
    for rank in range(SIZE):
        for step, (got, expected) in enumerate(zip(ranks[rank][config], want)):
            for name in expected:
                assert torch.equal(got[name], expected[name]), (rank, step, name)
    for step, (zero, one) in enumerate(zip(ranks[0][config], ranks[1][config])):
        assert all(torch.equal(zero[name], one[name]) for name in zero), step


def test_the_model_is_what_it_claims(ranks):
    """Guards against a vacuous pass: the tied weight is listed once, frozen parameters never
    move, and every trained parameter (the branch's too) moved."""
    model = common.torch_everyday_model()
    assert model.out.weight is model.embedding.weight
    assert [n for n, _ in model.named_parameters()] == [
        "embedding.weight",
        "frozen.weight",
        "frozen.bias",
        "hidden.weight",
        "hidden.bias",
        "branch.weight",
        "branch.bias",
        "out.bias",
    ]
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    for config in CONFIGS:
        for rank in range(SIZE):
            last = ranks[rank][config][-1]
            for name, p in initial.items():
                assert torch.equal(last[name], p) == name.startswith("frozen."), (config, rank, name)
