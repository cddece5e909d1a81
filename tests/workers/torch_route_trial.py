"""Worker: exchange="auto" (TopK 10%) measuring the cluster itself, through its route trial.
The measurement runs (its collectives and timings), and then its inputs are set so that the
model sends the first layer dense: a slow link, on which that layer's dense exchange is hidden
by the long window it is given. Saves every rank's choices after every step, for the trial's
schedule and its decision, which must be the same on every rank."""

import argparse
import copy
import os

import common
import horovod.torch as hvd
import torch

from sparsecomm import Network
from sparsecomm.torch import TopK

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, required=True)
args = parser.parse_args()
hvd.init()
torch.set_num_threads(1)
x_all, y_all = common.digits()
SLOW = Network(bandwidth=1e6, latency=1e-6)  # 2 ms of wire for a 2048-element dense tensor on 2 ranks
WINDOWS = {"0.weight": 10.0}  # its dense exchange fits in 10 s of backward: hidden, so the model sends it dense

model = common.torch_model()
compression = TopK(ratio=0.1, named_parameters=model.named_parameters(), **common.EVERY)
measure = compression._measure_network


def measured_then_set():
    _, local, windows, _ = measure()  # every rank measures, collectively, as in training
    return SLOW, local, dict(windows, **WINDOWS)


compression._measure_network = measured_then_set
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(), compression=compression
)
choices = []
for step in range(args.steps):
    idx = common.rows(step, hvd.rank(), hvd.size(), len(y_all))
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx])).backward()
    opt.step()
    choices.append(copy.deepcopy(compression.planner.choices))
torch.save({"choices": choices, "stats": compression.stats()}, os.path.join(args.out, f"rank{hvd.rank()}.pt"))
print(f"rank {hvd.rank()}/{hvd.size()}: {args.steps} steps done")
