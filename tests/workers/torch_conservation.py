"""Worker (1 rank under horovodrun): error feedback conserves. For 20 steps, each compressor
compresses a gradient and decompresses Horovod's result; saves per parameter the total
gradient, the total applied update and the final residual."""

import os

import common
import horovod.torch as hvd
import torch
from common import EVERY

from sparsecomm.torch import DGC, RandomBlock, RandomK, RTopK, Threshold, TopK

args = common.worker_parser().parse_args()
hvd.init()
x_all, y_all = common.digits()
CONFIGS = {
    "TopK": lambda m: TopK(exchange="allgather", ratio=0.05, named_parameters=m.named_parameters(), **EVERY),
    "RTopK": lambda m: RTopK(exchange="allgather", ratio=0.05, named_parameters=m.named_parameters(), **EVERY),
    "Threshold": lambda m: Threshold(exchange="allgather", ratio=0.05, named_parameters=m.named_parameters(), **EVERY),
    "Threshold_fp16": lambda m: Threshold(
        exchange="allgather", ratio=0.05, quantize="fp16", named_parameters=m.named_parameters(), **EVERY
    ),
    "Threshold_2bit": lambda m: Threshold(
        exchange="allgather", ratio=0.05, quantize="2bit", named_parameters=m.named_parameters(), **EVERY
    ),
    "DGC_no_momentum": lambda m: DGC(
        exchange="allgather", ratio=0.05, momentum=0.0, named_parameters=m.named_parameters(), **EVERY
    ),
    "RandomK": lambda m: RandomK(ratio=0.05, named_parameters=m.named_parameters(), **EVERY),
    "RandomBlock": lambda m: RandomBlock(ratio=0.05, named_parameters=m.named_parameters(), **EVERY),
}
results = {}
for config, make in CONFIGS.items():
    model = common.torch_model()
    compression = make(model)
    total_grad = {n: torch.zeros(p.numel(), dtype=torch.float64) for n, p in model.named_parameters()}
    total_sent = {n: torch.zeros(p.numel(), dtype=torch.float64) for n, p in model.named_parameters()}
    for step in range(20):
        model.zero_grad()
        idx = common.rows(step, 0, 1, len(y_all))
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx])).backward()
        for name, p in model.named_parameters():
            total_grad[name] += p.grad.reshape(-1).double()
            sent, ctx = compression.compress(p.grad)
            reduced = hvd.allreduce(sent, name=f"{config}.{name}.{step}", op=hvd.Average)
            total_sent[name] += compression.decompress(reduced, ctx).reshape(-1).double()
    residual = {name: s["residual"].double() for name, s in compression.state_dict()["parameters"].items()}
    results[config] = {"grad": total_grad, "sent": total_sent, "residual": residual}
torch.save(results, os.path.join(args.out, "rank0.pt"))
