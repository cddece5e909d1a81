"""RandomBlock under horovodrun -np 2 and -np 3 with stock hvd.DistributedOptimizer,
against a single-process plain-torch simulation of the N ranks."""
import os
import sys

import pytest
import torch

import reference
from launch import HERE, horovodrun

sys.path.insert(0, os.path.join(HERE, "multirank"))
import common  # noqa: E402

STEPS, LR = 5, 0.5


def simulate(size, ratio, seed):
    """N ranks in one process: per-rank gradients on the same rows as the workers, per-rank
    error feedback, the same shared-seed block, averaged like hvd.Average, plain SGD."""
    x_all, y_all = common.digits()
    model = common.torch_model()
    residuals = [{n: torch.zeros(p.numel()) for n, p in model.named_parameters()} for _ in range(size)]
    history = []
    for step in range(STEPS):
        grads = []
        for rank in range(size):
            model.zero_grad()
            idx = common.rows(step, rank, size, len(y_all))
            torch.nn.functional.cross_entropy(model(torch.from_numpy(x_all[idx])),
                                              torch.from_numpy(y_all[idx])).backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ratio is None:  # dense allreduce
                    update = sum(g[name] for g in grads) / size
                else:
                    n = p.numel()
                    start = reference.block_start(seed, reference.tensor_id(name), step, n)
                    sent = []
                    for rank in range(size):
                        values, residuals[rank][name] = reference.random_block_pack(
                            grads[rank][name], residuals[rank][name], start, reference.count(ratio, n))
                        sent.append(values)
                    update = reference.random_block_unpack(sum(sent) / size, n, start).view(p.shape)
                p -= LR * update
        history.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return history


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
def run(request, tmp_path_factory):
    size = request.param
    out = tmp_path_factory.mktemp(f"torch_np{size}")
    horovodrun(size, "torch_train.py", "--out", out, "--steps", STEPS, "--lr", LR)
    return size, [torch.load(out / f"rank{r}.pt") for r in range(size)]


def _assert_history_close(got, want, **tol):
    for step, (g, w) in enumerate(zip(got, want)):
        for name in w:
            torch.testing.assert_close(g[name], w[name], msg=lambda m: f"step {step}, {name}: {m}", **tol)


@pytest.mark.parametrize("config,ratio", [("dense", None), ("random_block_0.1", 0.1), ("random_block_1.0", 1.0)])
def test_every_rank_equals_the_simulation(run, config, ratio):
    size, ranks = run
    want = simulate(size, ratio, seed=7)
    for rank in range(size):
        _assert_history_close(ranks[rank][config], want, rtol=1e-5, atol=1e-6)
    for rank in range(1, size):  # and the ranks agree with each other exactly
        _assert_history_close(ranks[rank][config], ranks[0][config], rtol=0, atol=0)


def test_sparse_training_actually_moved_every_parameter(run):
    """Guards against a vacuous pass: the compressed run updates parameters, and differs from dense."""
    _, ranks = run
    initial = dict(common.torch_model().named_parameters())
    sparse, dense = ranks[0]["random_block_0.1"][-1], ranks[0]["dense"][-1]
    for name, p in initial.items():
        assert not torch.equal(sparse[name], p.detach()), name
        assert not torch.equal(sparse[name], dense[name]), name


def test_ratio_one_equals_dense_allreduce(run):
    size, ranks = run
    tol = dict(rtol=0, atol=0) if size == 2 else dict(rtol=1e-6, atol=1e-7)  # 3 ranks: Gloo's chunked sum order
    _assert_history_close(ranks[0]["random_block_1.0"], ranks[0]["dense"], **tol)
