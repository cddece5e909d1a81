"""Worker: a few SGD steps of a small MLP on digits under hvd.DistributedOptimizer, for
several compression settings; saves every rank's parameters after every step."""

import os

import common
import horovod.torch as hvd
import torch

import sparsecomm.torch

args = common.add_sizes_argument(common.worker_parser(steps=5, lr=0.5)).parse_args()
SETS = common.start_torch(args.sizes)
x_all, y_all = common.digits()
TRAINED = common.train_compressors(sparsecomm.torch)


def named(config):
    """The compressor of TRAINED[config], bound to the model's named parameters, over the process
    set that `on` gives (common.set_arguments)."""
    return lambda model, on: TRAINED[config](dict(named_parameters=model.named_parameters(), **on))


def one_by_one(config):
    """TRAINED[config] with each tensor prepared alone: the compressor's grouping off (common.ONE_BY_ONE)."""

    def make(model, on):
        compression = named(config)(model, on)
        compression._grouping.ready = lambda: False
        return compression

    return make


# name -> (compression for the model, extra hvd.DistributedOptimizer arguments[, SGD arguments])
CONFIGS = {
    "dense": (lambda model, on: hvd.Compression.none, {}),
    **{config: (named(config), {}) for config in TRAINED},
    # optimizer momentum after the reduce, as a user pairs it with RandomBlock (random_block.md)
    "random_block_0.1_momentum": (named("random_block_0.1"), {}, {"momentum": 0.9}),
    "topk_0.1_sum": (named("topk_0.1"), {"op": hvd.Sum}),
    "topk_0.1_predivide": (named("topk_0.1"), {"gradient_predivide_factor": 2.0}),
    "dense_momentum": (lambda model, on: hvd.Compression.none, {}, {"momentum": 0.9}),
    **{f"{config}_one_by_one": (one_by_one(config), {}) for config in common.ONE_BY_ONE},
}


def run(size, process_set):
    """Every config on the ranks of `process_set`, saved in the folder of `size`."""
    on, results = common.set_arguments(hvd, process_set), {}
    for config, (make_compression, options, *sgd_options) in CONFIGS.items():
        model = common.torch_model()
        common.broadcast_torch_model(hvd, model, process_set)
        compression = make_compression(model, on)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=args.lr, **(sgd_options or [{}])[0]),
            named_parameters=model.named_parameters(),
            compression=compression,
            **options,
            **on,
        )
        history = []
        for step in range(args.steps):
            idx = common.rows(step, process_set.rank(), size, len(y_all))
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx]))
            loss.backward()
            opt.step()
            history.append({n: p.detach().clone() for n, p in model.named_parameters()})
        results[config] = history
        if hasattr(compression, "stats"):
            results[f"stats/{config}"] = compression.stats()
            results[f"grouped/{config}"] = max(len(bucket.states) for bucket in compression._buckets.values())
    torch.save(results, os.path.join(common.size_folder(args.out, size), f"rank{process_set.rank()}.pt"))
    print(f"rank {process_set.rank()}/{size}: {len(results)} configs x {args.steps} steps done")


common.for_each_size(hvd, SETS, run, torch.zeros(1))
