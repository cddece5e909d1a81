"""Worker: hvd.DistributedOptimizer's options with sparsecomm compressors: several backward
passes per step, grouped allreduce, gradients kept between steps (set_to_none=False), a
parameter without gradient, fp16 parameters and gradients. Saves every rank's parameters
after every step. --sizes: each size in turn on the first N ranks (common.sizes_of)."""

import os

import common
import horovod.torch as hvd
import torch
from common import EVERY

from sparsecomm.torch import RandomBlock, TopK

args = common.add_sizes_argument(common.worker_parser(steps=4, lr=0.5)).parse_args()
SETS = common.start_torch(args.sizes)
x_all, y_all = common.digits()
topk = lambda model, on: TopK(exchange="allgather", ratio=0.1, named_parameters=model.named_parameters(), **EVERY, **on)  # noqa: E731
block = lambda model, on: RandomBlock(ratio=0.1, seed=3, named_parameters=model.named_parameters(), **EVERY, **on)  # noqa: E731
# name -> (model, compression, optimizer options, passes per step, set_to_none, dtype)
CONFIGS = {
    "topk_passes2": (common.torch_model, topk, {"backward_passes_per_step": 2}, 2, True, torch.float32),
    "topk_groups2": (common.torch_model, topk, {"num_groups": 2}, 1, True, torch.float32),
    "block_groups2": (common.torch_model, block, {"num_groups": 2}, 1, True, torch.float32),
    "topk_keep_grads": (common.torch_model, topk, {}, 1, False, torch.float32),
    "topk_spare": (common.torch_model_with_spare, topk, {}, 1, True, torch.float32),
    "topk_fp16": (common.torch_model, topk, {}, 1, True, torch.float16),
    "topk_sparse_as_dense": (common.torch_bag_model, topk, {"sparse_as_dense": True}, 1, True, torch.float32),
}


def run(size, process_set):
    """Every config on the ranks of `process_set`, saved in the folder of `size`."""
    on, results = common.set_arguments(hvd, process_set), {}
    for config, (make_model, make_compression, options, passes, set_to_none, dtype) in CONFIGS.items():
        model = make_model().to(dtype)
        common.broadcast_torch_model(hvd, model, process_set)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=args.lr),
            named_parameters=model.named_parameters(),
            compression=make_compression(model, on),
            **options,
            **on,
        )
        history = []
        for step in range(args.steps):
            model.zero_grad(set_to_none=set_to_none)
            for p in range(passes):
                idx = common.rows(step * passes + p, process_set.rank(), size, len(y_all))
                loss = torch.nn.functional.cross_entropy(
                    model(torch.from_numpy(x_all[idx]).to(dtype)).float(), torch.from_numpy(y_all[idx])
                )
                loss.backward()
            opt.step()
            history.append({n: p.detach().clone() for n, p in model.named_parameters()})
        results[config] = history
    torch.save(results, os.path.join(common.size_folder(args.out, size), f"rank{process_set.rank()}.pt"))
    print(f"rank {process_set.rank()}/{size}: {len(results)} configs done")


common.for_each_size(hvd, SETS, run, torch.zeros(1))
