"""Worker: every torch compressor trains an everyday model (common.torch_everyday_model: a
tied embedding and output layer, a frozen layer, a branch that some ranks skip at some
steps) under stock hvd.DistributedOptimizer. Two variants: gradients set to None between steps
(opt.zero_grad(), torch's default) and model.named_parameters(); gradients zeroed
(model.zero_grad(set_to_none=False)) and the tied weight listed under both its names
(named_parameters(remove_duplicate=False), to Horovod and to the compressor).
Saves every rank's parameters after every step."""

import os

import common
import horovod.torch as hvd
import torch
from common import EVERY

from sparsecomm.torch import DGC, RandomBlock, RandomK, RTopK, Threshold, TopK

args = common.worker_parser(steps=6, lr=0.5).parse_args()
common.start_torch()
x_all, y_all = common.digits()
COMPRESSORS = {
    "topk": lambda named: TopK(exchange="allgather", ratio=0.1, named_parameters=named, **EVERY),
    "rtopk": lambda named: RTopK(exchange="allgather", ratio=0.1, r=0.3, seed=7, named_parameters=named, **EVERY),
    "threshold": lambda named: Threshold(exchange="allgather", ratio=0.1, named_parameters=named, **EVERY),
    "dgc": lambda named: DGC(exchange="allgather", ratio=0.1, momentum=0.9, named_parameters=named, **EVERY),
    "randomk": lambda named: RandomK(ratio=0.1, seed=7, named_parameters=named, **EVERY),
    "random_block": lambda named: RandomBlock(ratio=0.1, seed=7, named_parameters=named, **EVERY),
}
results = {}
# variant -> (gradients set to None between steps, the tied weight listed under both its names)
VARIANTS = {"default": (True, False), "zeroed,listed_twice": (False, True)}
for method, make_compression in COMPRESSORS.items():
    for variant, (set_to_none, listed_twice) in VARIANTS.items():
        model = common.torch_everyday_model()
        named = lambda: model.named_parameters(remove_duplicate=not listed_twice)  # noqa: E731
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=args.lr),
            named_parameters=named(),
            compression=make_compression(named()),
        )
        history = []
        for step in range(args.steps):
            if set_to_none:
                opt.zero_grad()  # torch's default: set_to_none (Horovod's zero_grad takes no argument)
            else:
                model.zero_grad(set_to_none=False)
            idx = common.rows(step, hvd.rank(), hvd.size(), len(y_all))
            logits = model(torch.from_numpy(x_all[idx]), branch=common.uses_branch(step, hvd.rank()))
            torch.nn.functional.cross_entropy(logits, torch.from_numpy(y_all[idx])).backward()
            opt.step()
            history.append({n: p.detach().clone() for n, p in model.named_parameters()})
        results[f"{method}/{variant}"] = history
torch.save(results, os.path.join(args.out, f"rank{hvd.rank()}.pt"))
print(f"rank {hvd.rank()}/{hvd.size()}: {len(results)} configs done")
