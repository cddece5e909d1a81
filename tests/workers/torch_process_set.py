"""Worker (3 ranks): ranks 0 and 1 train in a process set, with the optimizer and the
compressor given that set; rank 2 stays out. Saves the trained ranks' parameters. Then every
rank trains with its own set (the pair, or rank 2 alone) given to only one of the optimizer and
the compressor, and prints what its first step raised (core.placement): silently wrong gradients
otherwise."""

import os

import common
import horovod.torch as hvd
import torch
from common import EVERY

from sparsecomm.torch import RandomBlock, TopK

args = common.worker_parser(steps=4).parse_args()
pair, alone = hvd.ProcessSet([0, 1]), hvd.ProcessSet([2])
hvd.init(process_sets=[pair, alone])
torch.set_num_threads(1)
x_all, y_all = common.digits()
CONFIGS = {
    "topk": lambda model, process_set: TopK(
        exchange="allgather", ratio=0.1, named_parameters=model.named_parameters(), process_set=process_set, **EVERY
    ),
    "random_block": lambda model, process_set: RandomBlock(
        ratio=0.1, seed=3, named_parameters=model.named_parameters(), process_set=process_set, **EVERY
    ),
}


def train(config, steps, optimizer_set, compressor_set, own):
    """`steps` steps of the digits MLP on this rank's rows of `own`; the parameters after each."""
    model = common.torch_model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5),
        named_parameters=model.named_parameters(),
        compression=CONFIGS[config](model, compressor_set),
        process_set=optimizer_set,
    )
    history = []
    for step in range(steps):
        idx = common.rows(step, own.rank(), own.size(), len(y_all))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx])).backward()
        opt.step()
        history.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return history


if pair.included():
    results = {config: train(config, args.steps, pair, pair, pair) for config in CONFIGS}
    torch.save(results, os.path.join(args.out, f"rank{hvd.rank()}.pt"))
print(f"rank {hvd.rank()}: {'trained in the pair' if pair.included() else 'outside the process set'}")
own = pair if pair.included() else alone
for mismatch, sets in {"optimizer_only": (own, None), "compressor_only": (hvd.global_process_set, own)}.items():
    try:
        train("topk", 2, *sets, own)
        print(f"rank {hvd.rank()}: {mismatch} trained")
    except ValueError as error:
        print(f"rank {hvd.rank()}: {mismatch} refused: {error}")
# Horovod shuts down as soon as any rank finishes, even one outside the set: all ranks meet here.
hvd.allreduce(torch.zeros(1), name="done")
