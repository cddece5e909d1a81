"""Worker: ranks construct compressors with different settings, or load checkpoints of different
steps (mid-run, or on one rank only before the first step); every rank must get the same clear
error before the first exchange (no hang), and equal settings must train normally."""

import common
import horovod.torch as hvd
import torch

from sparsecomm.torch import RandomBlock, TopK

hvd.init()
x_all, y_all = common.digits()
for ratio_of in (lambda rank: 0.1, lambda rank: 0.1 if rank == 0 else 0.2):
    model = common.torch_model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        compression=TopK(exchange="allgather", ratio=ratio_of(hvd.rank()), named_parameters=model.named_parameters()),
    )
    idx = common.rows(0, hvd.rank(), hvd.size(), len(y_all))
    try:
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx])).backward()
        opt.step()
        print(f"rank {hvd.rank()}: trained")
    except ValueError as error:
        print(f"rank {hvd.rank()}: ValueError: {error}")


def compressing(compression, model):
    return hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(), compression=compression
    )


def train_steps(opt, compression, model, steps, first=0):
    """Steps of `model` through `opt`; the compressor's state_dict after each."""
    saved = {}
    for step in range(first, first + steps):
        idx = common.rows(step, hvd.rank(), hvd.size(), len(y_all))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx])).backward()
        opt.step()
        saved[step + 1] = compression.state_dict()
    return saved


# Checkpoints that differ across ranks: every rank must raise the same error before the first exchange.
model = common.torch_model()
compression = RandomBlock(ratio=0.05, seed=7, named_parameters=model.named_parameters(), **common.EVERY)
opt = compressing(compression, model)
saved = train_steps(opt, compression, model, 4)
for case, load in (
    ("mid-run", lambda c: c.load_state_dict(saved[2 if hvd.rank() == 0 else 4])),
    ("first step", lambda c: c.load_state_dict(saved[4]) if hvd.rank() == 1 else None),
):
    if case == "first step":
        model = common.torch_model()
        compression = RandomBlock(ratio=0.05, seed=7, named_parameters=model.named_parameters(), **common.EVERY)
        opt = compressing(compression, model)
    load(compression)
    try:
        train_steps(opt, compression, model, 1, first=4)
        print(f"rank {hvd.rank()}: {case}: trained")
    except ValueError as error:
        print(f"rank {hvd.rank()}: {case}: ValueError: {error}")
