"""Worker of the self-check's training smoke tests: a tiny MLP trained for a few SGD steps,
once per sparsecomm configuration (DGC and TopK, each with exchange="allgather" and "spardl";
under DDP also Threshold in 2 bits, DGC with "auto" and RandomBlock). --way horovod (under horovodrun): stock
hvd.DistributedOptimizer; --way ddp (under torchrun): DistributedDataParallel with
sparsecomm.torch.ddp_hook, over NCCL on cuda and Gloo on cpu.

Rank 0 writes one record per configuration to --out (JSON): the loss on a fixed evaluation
set before and after training, whether every rank ended with bitwise identical parameters,
the exchanges the compressor used and the bytes it sent against a dense allreduce.

Needs nothing but torch, sparsecomm and Horovod (--way horovod): the data is synthetic (a fixed random linear
teacher labels Gaussian inputs), identical on every rank, and each rank reads its own rows."""

import argparse
import json
import os

import torch

from sparsecomm.torch import DGC, RandomBlock, Threshold, TopK, ddp_hook, destroy_process_group

# Compress every tensor, however small: the default policy would send this model's small and
# 1-D tensors dense, and the kernels would never run.
EVERY = dict(min_numel=0, dense_1d=False)
# name -> (compressor, its settings); DGC carries its own momentum (the optimizer is plain SGD).
CONFIGS = {
    "DGC allgather": (DGC, dict(ratio=0.1, momentum=0.9, exchange="allgather")),
    "DGC spardl": (DGC, dict(ratio=0.1, momentum=0.9, exchange="spardl")),
    "TopK allgather": (TopK, dict(ratio=0.1, exchange="allgather")),
    "TopK spardl": (TopK, dict(ratio=0.1, exchange="spardl")),
}
DDP_CONFIGS = {
    **CONFIGS,
    "Threshold 2bit": (Threshold, dict(ratio=0.1, quantize="2bit", exchange="allgather")),
    "DGC auto": (DGC, dict(ratio=0.1, momentum=0.9, exchange="auto")),  # measures the group's network
    "RandomBlock": (RandomBlock, dict(ratio=0.1, seed=1)),
}
ROWS, FEATURES, CLASSES, BATCH = 2048, 32, 10, 32


def dataset(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, FEATURES, generator=g)
    y = (x @ torch.randn(FEATURES, CLASSES, generator=g)).argmax(1)
    return x.to(device), y.to(device)


def tiny_model(device):
    torch.manual_seed(0)  # same initial weights on every rank (broadcast makes sure anyway)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES)).to(device)


class Horovod:
    """hvd.DistributedOptimizer with the compressor."""

    def __init__(self):
        import horovod.torch as hvd

        hvd.init()
        self.hvd, self.rank, self.size, self.local_rank = hvd, hvd.rank(), hvd.size(), hvd.local_rank()

    def wrap(self, model, compression, lr):
        """(what runs the forward pass, the optimizer)."""
        opt = self.hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=lr),
            named_parameters=model.named_parameters(),
            compression=compression,
        )
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model, opt

    def gathered(self, flat, name):
        return self.hvd.allgather(flat, name=f"check.params.{name}")

    def close(self):
        self.hvd.shutdown()


class DDP:
    """DistributedDataParallel with the compressor as its communication hook."""

    def __init__(self, device):
        import torch.distributed as dist

        dist.init_process_group("nccl" if device == "cuda" else "gloo")
        self.dist, self.rank, self.size = dist, dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))

    def wrap(self, model, compression, lr):
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(compression, ddp_hook)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=lr)

    def gathered(self, flat, name):
        everyone = [torch.empty_like(flat) for _ in range(self.size)]
        self.dist.all_gather(everyone, flat)
        return torch.cat(everyone)

    def close(self):
        destroy_process_group()


def train(way, configs, name, steps, lr, x, y):
    model = tiny_model(x.device)
    kind, settings = configs[name]
    compression = kind(named_parameters=model.named_parameters(), **settings, **EVERY)
    forward, opt = way.wrap(model, compression, lr)
    loss = torch.nn.functional.cross_entropy
    with torch.no_grad():
        before = loss(model(x), y).item()
    for step in range(steps):
        first = (step * way.size + way.rank) * BATCH % ROWS  # disjoint rows per rank
        rows = slice(first, first + BATCH)
        opt.zero_grad()
        loss(forward(x[rows]), y[rows]).backward()
        opt.step()
    with torch.no_grad():
        after = loss(model(x), y).item()
    flat = torch.cat([p.detach().reshape(1, -1) for p in model.parameters()], dim=1)
    everyone = way.gathered(flat, name)  # one row per rank
    stats = compression.stats()
    exchanges = sorted({t.get("exchange") or "" for t in stats["tensors"].values()} - {""})
    return {
        "config": name,
        "exchange": settings.get("exchange"),  # None: shared coordinates, over the dense allreduce
        "device": str(x.device),
        "ranks": way.size,
        "steps": steps,
        "loss_before": before,
        "loss_after": after,
        "ranks_equal": all(torch.equal(everyone[0], row) for row in everyone[1:]),
        "max_rank_difference": (everyone - everyone[0]).abs().max().item(),
        "exchanges": exchanges,
        "sent_bytes": stats["sent_bytes"],
        "dense_bytes": stats["dense_bytes"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--way", default="horovod", choices=["horovod", "ddp"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    way, configs = (Horovod(), CONFIGS) if args.way == "horovod" else (DDP(args.device), DDP_CONFIGS)
    device = torch.device("cpu")
    if args.device == "cuda":  # one GPU per rank when there are enough, else they share
        device = torch.device("cuda", way.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    x, y = dataset(device)
    records = []
    for name in configs:
        record = train(way, configs, name, args.steps, args.lr, x, y)
        print(
            f"[check] rank {way.rank} {device}: {name}: loss {record['loss_before']:.4f} -> "
            f"{record['loss_after']:.4f}, ranks equal: {record['ranks_equal']}",
            flush=True,
        )
        records.append(record)
    if way.rank == 0:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)
    way.close()


if __name__ == "__main__":
    main()
