"""Horovod + TensorFlow + sparsecomm's TF op library on 2 and 3 ranks (one horovodrun -np 3,
the 2 ranks a process set of it), against a single-process simulation of the N ranks (plain
torch/numpy reference)."""

import common
import numpy as np
import pytest
import reference
import torch
from launch import sizes_fixture

pytest.importorskip("tensorflow")
STEPS, SEED, RATIO = 4, 5, 0.2
TENSORS = {"w_f32": (1000, torch.float32), "w_f16": (257, torch.float16), "w_bf16": (165, torch.bfloat16)}


def gradient(name, step, rank):
    numel, dtype = TENSORS[name]
    rng = np.random.default_rng([step, rank, reference.tensor_id(name)])
    return torch.from_numpy(rng.standard_normal(numel).astype(np.float32)).to(dtype)


run = sizes_fixture("tf_block_allreduce.py", "--steps", STEPS)


@pytest.mark.parametrize("name", list(TENSORS))
def test_block_allreduce_equals_simulation(run, name):
    size, ranks = run
    numel, dtype = TENSORS[name]
    residuals = [torch.zeros(numel) for _ in range(size)]
    for step in range(STEPS):
        start = reference.block_start(SEED, reference.tensor_id(name), step, numel)
        sent = []
        for rank in range(size):
            values, residuals[rank] = reference.random_block_pack(
                gradient(name, step, rank), residuals[rank], start, reference.count(RATIO, numel)
            )
            sent.append(values.float())
        summed = sum(sent).to(dtype)
        want = reference.random_block_unpack(summed, numel, start).float().numpy()
        # Horovod adds in the wire dtype (fp16 in fp16, rounding each partial sum: the error is
        # a unit at the size of the summed magnitudes, not of the cancelled result), and the sum
        # is rounded once more to the gradient dtype.
        wire = torch.float32 if dtype == torch.bfloat16 else dtype
        magnitude = reference.random_block_unpack(sum(v.abs() for v in sent), numel, start).numpy()
        bound = 2 * torch.finfo(wire).eps * magnitude + torch.finfo(dtype).eps * np.abs(want)
        for rank in range(size):
            got = ranks[rank][f"{name}/dense/{step}"]
            assert (np.abs(got - want) <= bound).all(), f"{name} step {step} rank {rank}: {np.abs(got - want).max()}"
            np.testing.assert_array_equal(
                ranks[rank][f"{name}/residual/{step}"],
                residuals[rank].numpy(),
                err_msg=f"{name} residual, step {step} rank {rank}",
            )
            np.testing.assert_array_equal(got, ranks[0][f"{name}/dense/{step}"])  # ranks agree exactly


def test_distributed_gradient_tape_step_equals_simulation(run):
    size, ranks = run
    x_all, y_all = common.digits()
    w = torch.zeros(64, 10, requires_grad=True)
    grads = []
    for rank in range(size):
        idx = common.rows(0, rank, size, len(y_all))
        loss = torch.nn.functional.cross_entropy(torch.from_numpy(x_all[idx]) @ w, torch.from_numpy(y_all[idx]))
        grads.append(torch.autograd.grad(loss, w)[0])
    want = (-0.5 * sum(grads) / size).numpy()
    for rank in range(size):
        np.testing.assert_allclose(ranks[rank]["tape/w"], want, rtol=1e-5, atol=1e-6)
