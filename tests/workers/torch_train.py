"""Worker: a few SGD steps of a small MLP on digits under hvd.DistributedOptimizer, for
several compression settings; saves every rank's parameters after every step."""

import argparse
import os

import common
import horovod.torch as hvd
import torch
from common import EVERY

from sparsecomm.torch import DGC, RandomBlock, RandomK, RTopK, Threshold, TopK

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.5)
args = parser.parse_args()

hvd.init()
torch.set_num_threads(1)
x_all, y_all = common.digits()
# name -> (compression for the model, extra hvd.DistributedOptimizer arguments[, SGD arguments])
CONFIGS = {
    "dense": (lambda model: hvd.Compression.none, {}),
    "random_block_0.1": (
        lambda model: RandomBlock(ratio=0.1, seed=7, named_parameters=model.named_parameters(), **EVERY),
        {},
    ),
    # optimizer momentum after the reduce, as a user pairs it with RandomBlock (random_block.md)
    "random_block_0.1_momentum": (
        lambda model: RandomBlock(ratio=0.1, seed=7, named_parameters=model.named_parameters(), **EVERY),
        {},
        {"momentum": 0.9},
    ),
    "random_block_1.0": (
        lambda model: RandomBlock(ratio=1.0, seed=7, named_parameters=model.named_parameters(), **EVERY),
        {},
    ),
    "topk_0.1": (
        lambda model: TopK(exchange="allgather", ratio=0.1, named_parameters=model.named_parameters(), **EVERY),
        {},
    ),
    "topk_1.0": (
        lambda model: TopK(
            exchange="allgather", ratio=1.0, named_parameters=model.named_parameters(), dense_fallback=False, **EVERY
        ),
        {},
    ),
    "topk_0.1_sum": (
        lambda model: TopK(exchange="allgather", ratio=0.1, named_parameters=model.named_parameters(), **EVERY),
        {"op": hvd.Sum},
    ),
    "topk_0.1_predivide": (
        lambda model: TopK(exchange="allgather", ratio=0.1, named_parameters=model.named_parameters(), **EVERY),
        {"gradient_predivide_factor": 2.0},
    ),
    "randomk_0.1": (lambda model: RandomK(ratio=0.1, seed=7, named_parameters=model.named_parameters(), **EVERY), {}),
    "randomk_1.0": (lambda model: RandomK(ratio=1.0, seed=7, named_parameters=model.named_parameters(), **EVERY), {}),
    "rtopk_0.1": (
        lambda model: RTopK(
            exchange="allgather", ratio=0.1, r=0.3, seed=7, named_parameters=model.named_parameters(), **EVERY
        ),
        {},
    ),
    "rtopk_1.0": (
        lambda model: RTopK(
            exchange="allgather",
            ratio=1.0,
            seed=7,
            named_parameters=model.named_parameters(),
            dense_fallback=False,
            **EVERY,
        ),
        {},
    ),
    "threshold_0.1_1bit": (
        lambda model: Threshold(
            exchange="allgather", ratio=0.1, quantize="1bit", named_parameters=model.named_parameters(), **EVERY
        ),
        {},
    ),
    "threshold_0.1_2bit": (
        lambda model: Threshold(
            exchange="allgather", ratio=0.1, quantize="2bit", named_parameters=model.named_parameters(), **EVERY
        ),
        {},
    ),
    "threshold_1.0": (
        lambda model: Threshold(
            exchange="allgather", ratio=1.0, named_parameters=model.named_parameters(), dense_fallback=False, **EVERY
        ),
        {},
    ),
    "threshold_0.1": (
        lambda model: Threshold(exchange="allgather", ratio=0.1, named_parameters=model.named_parameters(), **EVERY),
        {},
    ),
    "threshold_0.1_fp16": (
        lambda model: Threshold(
            exchange="allgather", ratio=0.1, quantize="fp16", named_parameters=model.named_parameters(), **EVERY
        ),
        {},
    ),
    "dgc_0.1": (
        lambda model: DGC(
            exchange="allgather", ratio=0.1, momentum=0.9, named_parameters=model.named_parameters(), **EVERY
        ),
        {},
    ),
    "dgc_0.05_warmup_clip": (
        lambda model: DGC(
            exchange="allgather",
            ratio=0.05,
            momentum=0.9,
            warmup_steps=4,
            warmup_stages=2,
            clip_norm=0.2,
            named_parameters=model.named_parameters(),
            **EVERY,
        ),
        {},
    ),
    "dgc_1.0_no_masking": (
        lambda model: DGC(
            exchange="allgather",
            ratio=1.0,
            momentum=0.9,
            momentum_masking=False,
            dense_fallback=False,
            named_parameters=model.named_parameters(),
            **EVERY,
        ),
        {},
    ),
    # the default policy sends 0.bias, 2.weight (320 elements) and 2.bias dense, with DGC's momentum
    "dgc_0.1_default_policy": (
        lambda model: DGC(exchange="allgather", ratio=0.1, momentum=0.9, named_parameters=model.named_parameters()),
        {},
    ),
    # the same with clipping: the dense route's momentum pass reads the clipping factor too
    "dgc_0.1_default_policy_clip": (
        lambda model: DGC(
            exchange="allgather", ratio=0.1, momentum=0.9, clip_norm=0.2, named_parameters=model.named_parameters()
        ),
        {},
    ),
    # Nesterov momentum on the default policy: a sparse tensor and the dense route's momentum pass
    "dgc_0.1_nesterov": (
        lambda model: DGC(
            exchange="allgather", ratio=0.1, momentum=0.9, nesterov=True, named_parameters=model.named_parameters()
        ),
        {},
    ),
    # warm-up stage 0 has density 0.71: sparse (6-byte rows) would be larger, so it goes dense
    # (momentum SGD); then 0.5, sparse
    "dgc_0.5_warmup_dense_stage": (
        lambda model: DGC(
            exchange="allgather",
            ratio=0.5,
            momentum=0.9,
            warmup_steps=2,
            warmup_stages=1,
            named_parameters=model.named_parameters(),
            **EVERY,
        ),
        {},
    ),
    "dense_momentum": (lambda model: hvd.Compression.none, {}, {"momentum": 0.9}),
    # the default policy: 1-D tensors and tensors under 1024 elements (2.weight: 320) go dense
    "topk_0.1_default_policy": (
        lambda model: TopK(exchange="allgather", ratio=0.1, named_parameters=model.named_parameters()),
        {},
    ),
    "topk_0.1_no_feedback": (
        lambda model: TopK(
            exchange="allgather", ratio=0.1, named_parameters=model.named_parameters(), error_feedback=False, **EVERY
        ),
        {},
    ),
}
results = {}
for config, (make_compression, options, *sgd_options) in CONFIGS.items():
    model = common.torch_model()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = make_compression(model)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, **(sgd_options or [{}])[0]),
        named_parameters=model.named_parameters(),
        compression=compression,
        **options,
    )
    history = []
    for step in range(args.steps):
        idx = common.rows(step, hvd.rank(), hvd.size(), len(y_all))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx]))
        loss.backward()
        opt.step()
        history.append({n: p.detach().clone() for n, p in model.named_parameters()})
    results[config] = history
    if hasattr(compression, "stats"):
        results[f"stats/{config}"] = compression.stats()
torch.save(results, os.path.join(args.out, f"rank{hvd.rank()}.pt"))
print(f"rank {hvd.rank()}/{hvd.size()}: {len(results)} configs x {args.steps} steps done")
