"""Worker: exchange="auto" (TopK 10%) measuring the cluster itself, through its route trial.
The measurement runs (its collectives and timings), and then its inputs are set so that the
model sends the first layer dense: a slow link, on which that layer's dense exchange is hidden
by the long window it is given (and no watched step: every side is tried). Saves every rank's
choices after every step, for the trial's schedule and its decision, which must be the same on
every rank. Then a checkpoint, and `--resumed` steps of a new model, compressor and optimizer
restored from it, as a restarted job: their choices and how often they measured."""

import copy
import os

import common
import horovod.torch as hvd
import torch

from sparsecomm import Network
from sparsecomm.torch import TopK

parser = common.worker_parser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--resumed", type=int, default=0)
args = parser.parse_args()
common.start_torch()
x_all, y_all = common.digits()
SLOW = Network(bandwidth=1e6, latency=1e-6)  # 2 ms of wire for a 2048-element dense tensor on 2 ranks
WINDOWS = {"0.weight": 10.0}  # its dense exchange fits in 10 s of backward: hidden, so the model sends it dense


def compressor(model, measures):
    """TopK 10% by auto, its measurement run and then set (SLOW, WINDOWS); each call in `measures`."""
    compression = TopK(ratio=0.1, named_parameters=model.named_parameters(), **common.EVERY)
    measure = compression._measure_network

    def measured_then_set(device):
        measures.append(1)
        _, local, windows, *_ = measure(device)  # every rank measures, collectively, as in training
        return SLOW, local, dict(windows, **WINDOWS)

    compression._measure_network = measured_then_set
    return compression


def train(model, compression, steps, first=0):
    """`steps` steps from step `first`; the compressor's choices after each."""
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(), compression=compression
    )
    choices = []
    for step in range(first, first + steps):
        idx = common.rows(step, hvd.rank(), hvd.size(), len(y_all))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x_all[idx])), torch.from_numpy(y_all[idx])).backward()
        opt.step()
        choices.append(copy.deepcopy(compression.planner.choices))
    return choices


model = common.torch_model()
compression = compressor(model, [])
choices = train(model, compression, args.steps)
checkpoint = os.path.join(args.out, f"checkpoint{hvd.rank()}.pt")
torch.save({"model": model.state_dict(), "compression": compression.state_dict()}, checkpoint)
saved = torch.load(checkpoint)  # a restarted job: everything new, from the checkpoint
model, measures = common.torch_model(), []
model.load_state_dict(saved["model"])
compression = compressor(model, measures)
compression.load_state_dict(saved["compression"])
resumed = train(model, compression, args.resumed, first=args.steps)
result = {"choices": choices, "resumed_choices": resumed, "resumed_measures": len(measures)}
result["params"] = {name: p.detach().clone() for name, p in model.named_parameters()}
torch.save(result, os.path.join(args.out, f"rank{hvd.rank()}.pt"))
print(f"rank {hvd.rank()}/{hvd.size()}: {args.steps} + {args.resumed} steps done")
