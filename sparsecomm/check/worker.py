"""Worker of the self-check's 2-rank training smoke test (started by sparsecomm.check under
horovodrun): a tiny MLP trained for a few SGD steps under stock hvd.DistributedOptimizer, once
per sparsecomm configuration (DGC and TopK, each with exchange="allgather" and "spardl").

Rank 0 writes one record per configuration to --out (JSON): the loss on a fixed evaluation
set before and after training, whether every rank ended with bitwise identical parameters,
the exchanges the compressor used and the bytes it sent against a dense allreduce.

Needs nothing but torch, Horovod and sparsecomm: the data is synthetic (a fixed random linear
teacher labels Gaussian inputs), identical on every rank, and each rank reads its own rows."""

import argparse
import json

import horovod.torch as hvd
import torch

from sparsecomm.torch import DGC, TopK

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
ROWS, FEATURES, CLASSES, BATCH = 2048, 32, 10, 32


def dataset(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, FEATURES, generator=g)
    y = (x @ torch.randn(FEATURES, CLASSES, generator=g)).argmax(1)
    return x.to(device), y.to(device)


def tiny_model(device):
    torch.manual_seed(0)  # same initial weights on every rank (broadcast makes sure anyway)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES)).to(device)


def train(name, steps, lr, x, y):
    model = tiny_model(x.device)
    kind, settings = CONFIGS[name]
    compression = kind(named_parameters=model.named_parameters(), **settings, **EVERY)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr), named_parameters=model.named_parameters(), compression=compression
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loss = torch.nn.functional.cross_entropy
    with torch.no_grad():
        before = loss(model(x), y).item()
    for step in range(steps):
        first = (step * hvd.size() + hvd.rank()) * BATCH % ROWS  # disjoint rows per rank
        rows = slice(first, first + BATCH)
        opt.zero_grad()
        loss(model(x[rows]), y[rows]).backward()
        opt.step()
    with torch.no_grad():
        after = loss(model(x), y).item()
    flat = torch.cat([p.detach().reshape(1, -1) for p in model.parameters()], dim=1)
    everyone = hvd.allgather(flat, name=f"check.params.{name}")  # one row per rank
    stats = compression.stats()
    exchanges = sorted({t.get("exchange") or "" for t in stats["tensors"].values()} - {""})
    return {
        "config": name,
        "exchange": settings["exchange"],
        "device": str(x.device),
        "ranks": hvd.size(),
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
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if args.device == "cuda":  # one GPU per rank when there are enough, else they share
        device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
    x, y = dataset(device)
    records = []
    for name in CONFIGS:
        record = train(name, args.steps, args.lr, x, y)
        print(
            f"[check] rank {hvd.rank()} {device}: {name}: loss {record['loss_before']:.4f} -> "
            f"{record['loss_after']:.4f}, ranks equal: {record['ranks_equal']}",
            flush=True,
        )
        records.append(record)
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
