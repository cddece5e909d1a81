"""Worker of the end-to-end benchmark (run by sparsecomm.bench.e2e under horovodrun): step
time of one model with hvd.DistributedOptimizer, for dense allreduce and each sparsecomm
method, on the same ranks and network. Medians over the timed steps, after warm-up steps.

Models (data content does not change the step time, so inputs are fixed random tensors):
  comm     MLP 1024-4096-4096-1024 (25.2M parameters, 101 MB of float32 gradient), batch 8:
           little compute, a large gradient: communication dominates on a slow network.
  compute  a CNN on 32x32x3 images (0.29M parameters), batch 32: compute dominates.
"""
import argparse
import json
import statistics
import time

import horovod.torch as hvd
import torch

from sparsecomm.torch import DGC, RandomBlock, Threshold, TopK

# name -> (compression(model), optimizer momentum). DGC carries its own momentum.
METHODS = {
    "dense": (lambda m: hvd.Compression.none, 0.9),
    "dense fp16": (lambda m: hvd.Compression.fp16, 0.9),
    "DGC 0.1% allgather": (lambda m: DGC(ratio=0.001, exchange="allgather", named_parameters=m.named_parameters()), 0),
    "DGC 0.1% spardl": (lambda m: DGC(ratio=0.001, exchange="spardl", named_parameters=m.named_parameters()), 0),
    "DGC 0.1% auto": (lambda m: DGC(ratio=0.001, named_parameters=m.named_parameters()), 0),
    "Threshold 1%": (lambda m: Threshold(ratio=0.01, exchange="allgather", named_parameters=m.named_parameters()), 0),
    "Threshold 1% 2bit": (lambda m: Threshold(ratio=0.01, quantize="2bit", exchange="allgather",
                                              named_parameters=m.named_parameters()), 0),
    "TopK 1%": (lambda m: TopK(ratio=0.01, exchange="allgather", named_parameters=m.named_parameters()), 0),
    "RandomBlock 1%": (lambda m: RandomBlock(ratio=0.01, seed=1, named_parameters=m.named_parameters()), 0),
}


def model_and_batch(kind):
    torch.manual_seed(0)
    if kind == "comm":
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                                    torch.nn.ReLU(), torch.nn.Linear(4096, 1024))
        return model, torch.randn(8, 1024), torch.randint(0, 1024, (8,))
    conv = lambda i, o: [torch.nn.Conv2d(i, o, 3, padding=1), torch.nn.ReLU()]  # noqa: E731
    model = torch.nn.Sequential(*conv(3, 32), *conv(32, 64), torch.nn.MaxPool2d(2), *conv(64, 128),
                                torch.nn.MaxPool2d(2), *conv(128, 128), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(128, 10))
    return model, torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))


def bench(kind, method, warmup, steps):
    model, x, y = model_and_batch(kind)
    make, momentum = METHODS[method]
    compression = make(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=momentum),
                                   named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    times = []
    for step in range(warmup + steps):
        hvd.allreduce(torch.zeros(1), name="bench.barrier")  # every rank starts the step together
        started = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step >= warmup:
            times.append(time.perf_counter() - started)
    numel = sum(p.numel() for p in model.parameters())
    dense_bytes = numel * 4
    if hasattr(compression, "stats"):
        stats = compression.stats()
        calls = max(1, stats["calls"] // len(list(model.parameters())))
        sent, received = stats["sent_bytes"] / calls, stats["received_bytes"] / calls
        exchanges = sorted({t.get("exchange", "") for t in stats["tensors"].values()} - {""})
    else:  # Horovod's ring allreduce: each rank sends and receives 2 (N-1)/N of the (maybe fp16) gradient
        size = dense_bytes // (2 if method == "dense fp16" else 1)
        sent = received = 2 * (hvd.size() - 1) / hvd.size() * size
        exchanges = []
    # the slowest rank's median is the step time
    median = hvd.allreduce(torch.tensor([statistics.median(times)]), op=hvd.Max, name=f"bench.{method}").item()
    return {"model": kind, "method": method, "ranks": hvd.size(), "step_ms": 1000 * median,
            "sent_bytes": sent, "received_bytes": received, "dense_bytes": dense_bytes, "parameters": numel,
            "exchanges": exchanges}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["comm", "compute"], required=True)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    records = []
    for method in args.methods:
        records.append(bench(args.model, method, args.warmup, args.steps))
        if hvd.rank() == 0:
            print(f"[e2e] {args.model} np{hvd.size()} {method:<20} {records[-1]['step_ms']:9.1f} ms/step", flush=True)
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
