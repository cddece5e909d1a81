"""Worker: checkpoint -> restore -> continue equals not stopping. Each config trains 5 steps
straight; then 3 steps, saves model and compressor state (through torch.save bytes), builds
everything anew, restores, and trains 2 more. Saves both final parameter sets."""

import io
import os

import common
import horovod.torch as hvd
import torch
from common import EVERY

from sparsecomm.torch import DGC, RandomBlock

args = common.worker_parser().parse_args()
common.start_torch()
x_all, y_all = common.digits()
CONFIGS = {
    "dgc": lambda model: DGC(
        exchange="allgather",
        ratio=0.1,
        momentum=0.9,
        warmup_steps=4,
        warmup_stages=2,
        named_parameters=model.named_parameters(),
        **EVERY,
    ),
    "random_block": lambda model: RandomBlock(ratio=0.1, seed=5, named_parameters=model.named_parameters(), **EVERY),
}


def build(make_compression):
    model = common.torch_model()
    compression = make_compression(model)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5), named_parameters=model.named_parameters(), compression=compression
    )
    return model, compression, opt


def train(model, opt, steps):
    for step in steps:
        idx = common.rows(step, hvd.rank(), hvd.size(), len(y_all))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx])).backward()
        opt.step()


results = {}
for config, make_compression in CONFIGS.items():
    model, _, opt = build(make_compression)
    train(model, opt, range(5))
    results[f"{config}/straight"] = {n: p.detach().clone() for n, p in model.named_parameters()}

    model, compression, opt = build(make_compression)
    train(model, opt, range(3))
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "compression": compression.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    model, compression, opt = build(make_compression)  # a fresh start, as after a restart
    model.load_state_dict(saved["model"])
    compression.load_state_dict(saved["compression"])
    train(model, opt, range(3, 5))
    results[f"{config}/resumed"] = {n: p.detach().clone() for n, p in model.named_parameters()}
torch.save(results, os.path.join(args.out, f"rank{hvd.rank()}.pt"))
