"""Worker (3 ranks): ranks 0 and 1 train in a process set, with the optimizer and the
compressor given that set; rank 2 stays out. Saves the trained ranks' parameters."""

import os

import common
import horovod.torch as hvd
import torch
from common import EVERY

from sparsecomm.torch import RandomBlock, TopK

args = common.worker_parser(steps=4).parse_args()
pair = hvd.ProcessSet([0, 1])
hvd.init(process_sets=[pair])
torch.set_num_threads(1)
x_all, y_all = common.digits()
CONFIGS = {
    "topk": lambda model: TopK(
        exchange="allgather", ratio=0.1, named_parameters=model.named_parameters(), process_set=pair, **EVERY
    ),
    "random_block": lambda model: RandomBlock(
        ratio=0.1, seed=3, named_parameters=model.named_parameters(), process_set=pair, **EVERY
    ),
}
if pair.included():
    results = {}
    for config, make_compression in CONFIGS.items():
        model = common.torch_model()
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.5),
            named_parameters=model.named_parameters(),
            compression=make_compression(model),
            process_set=pair,
        )
        history = []
        for step in range(args.steps):
            idx = common.rows(step, pair.rank(), pair.size(), len(y_all))
            opt.zero_grad()
            torch.nn.functional.cross_entropy(
                model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx])
            ).backward()
            opt.step()
            history.append({n: p.detach().clone() for n, p in model.named_parameters()})
        results[config] = history
    torch.save(results, os.path.join(args.out, f"rank{hvd.rank()}.pt"))
print(f"rank {hvd.rank()}: {'trained in the pair' if pair.included() else 'outside the process set'}")
# Horovod shuts down as soon as any rank finishes, even one outside the set: all ranks meet here.
hvd.allreduce(torch.zeros(1), name="done")
