"""Demo worker (run under horovodrun): train a small MLP on scikit-learn's digits with
hvd.DistributedOptimizer, dense and with sparsecomm compressors, and write the results.

Each rank reads its own half of every batch; all ranks evaluate the same held-out 20%."""
import argparse
import json
import statistics
import time

import horovod.torch as hvd
import numpy as np
import torch

from sparsecomm.torch import DGC, RandomBlock, Threshold, TopK

# method -> compression for the model; SGD momentum per method where the demo's default does not apply
MOMENTUM = {"dense, momentum 0.9": 0.9}
METHODS = {
    "dense": lambda model: hvd.Compression.none,
    "dense, momentum 0.9": lambda model: hvd.Compression.none,  # the fair baseline for DGC
    "RandomBlock 10%": lambda model: RandomBlock(ratio=0.1, seed=1, named_parameters=model.named_parameters()),
    "RandomBlock 1%": lambda model: RandomBlock(ratio=0.01, seed=1, named_parameters=model.named_parameters()),
    "TopK 1%": lambda model: TopK(exchange="allgather", ratio=0.01, named_parameters=model.named_parameters()),
    "Threshold 1%": lambda model: Threshold(exchange="allgather", ratio=0.01, named_parameters=model.named_parameters()),
    # DGC's momentum replaces the optimizer's (plain SGD here); warm-up over the first 4 epochs.
    "DGC 1%": lambda model: DGC(exchange="allgather", ratio=0.01, momentum=0.9, warmup_steps=88, named_parameters=model.named_parameters()),
}


def data():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y.astype(np.int64), test_size=0.2, random_state=0, stratify=y)


def train(method, epochs, batch, lr, momentum):
    x_train, x_test, y_train, y_test = data()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = METHODS[method](model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
                                   named_parameters=model.named_parameters(), compression=compression)
    rng = np.random.default_rng(0)  # same permutation on every rank; each takes its own slice
    step_times, steps = [], 0
    for _ in range(epochs):
        order = rng.permutation(len(y_train))
        for first in range(0, len(order) - batch * hvd.size() + 1, batch * hvd.size()):
            idx = order[first + hvd.rank() * batch: first + (hvd.rank() + 1) * batch]
            started = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(torch.from_numpy(x_train[idx])),
                                              torch.from_numpy(y_train[idx])).backward()
            opt.step()
            step_times.append(time.perf_counter() - started)
            steps += 1
    with torch.no_grad():
        accuracy = (model(torch.from_numpy(x_test)).argmax(1).numpy() == y_test).mean()
    dense_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    sent_bytes = compression.stats()["sent_bytes"] / steps if hasattr(compression, "stats") else dense_bytes
    return {"method": method, "accuracy": float(accuracy), "steps": steps,
            "bytes_per_step": sent_bytes, "dense_bytes_per_step": dense_bytes,
            "step_ms": 1000 * statistics.median(step_times[len(step_times) // 10:])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    # Optimizer momentum with plain error feedback diverged here (RandomBlock 10%, momentum 0.9:
    # 17% accuracy); DGC's momentum correction is the method built for momentum.
    parser.add_argument("--momentum", type=float, default=0.0)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    results = [train(method, args.epochs, args.batch, args.lr, MOMENTUM.get(method, args.momentum))
               for method in METHODS]
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": hvd.size(), "epochs": args.epochs, "lr": args.lr, "momentum": args.momentum,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
