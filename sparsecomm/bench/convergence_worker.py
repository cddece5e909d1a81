"""Worker of the convergence benchmark (run by sparsecomm.bench under horovodrun): dense vs
each method at the papers' settings, same seeds, data order and epochs, on real data that
ships offline:

  digits   a small CNN on scikit-learn's digits (1,437 train / 360 held-out 8x8 images);
           test accuracy after each epoch.
  charlm   a character-level GRU language model on the Python standard library's sources
           (the first 600 kB of its .py files in sorted order; the last 10% held out);
           validation loss (nats per character) after each epoch.

Each rank trains on its own shard; the curves are rank 0's (the ranks stay identical).
"""

import argparse
import glob
import hashlib
import json
import math
import os
import platform

import horovod.torch as hvd
import numpy as np
import torch

from sparsecomm.torch import DGC, RandomBlock, RTopK, Threshold, TopK

TASKS = {  # epochs, batch per rank, learning rate, warm-up epochs and local clipping of DGC
    "digits": dict(epochs=30, batch=16, lr=0.05, warmup_epochs=4, clip_norm=None),
    "charlm": dict(epochs=6, batch=16, lr=0.25, warmup_epochs=1, clip_norm=1.0),
}


def methods(task, steps_per_epoch):
    """name -> (compression(model), optimizer momentum). The paper settings: DGC at 0.1% with
    its momentum and a 4-stage warm-up; gradient dropping at 1% (with and without 2-bit
    values); rTop-k; random-block; top-k with and without error feedback."""
    warmup = TASKS[task]["warmup_epochs"] * steps_per_epoch
    named = lambda m: dict(named_parameters=m.named_parameters())  # noqa: E731
    return {
        "dense": (lambda m: hvd.Compression.none, 0.9),
        "DGC 0.1%": (
            lambda m: DGC(
                ratio=0.001,
                momentum=0.9,
                warmup_steps=warmup,
                exchange="allgather",
                clip_norm=TASKS[task]["clip_norm"],
                **named(m),
            ),
            0.0,
        ),
        "Threshold 1%": (lambda m: Threshold(ratio=0.01, exchange="allgather", **named(m)), 0.9),
        "Threshold 1% 2bit": (lambda m: Threshold(ratio=0.01, quantize="2bit", exchange="allgather", **named(m)), 0.9),
        "RTopK 1% of 4%": (lambda m: RTopK(ratio=0.01, seed=1, exchange="allgather", **named(m)), 0.9),
        "RandomBlock 1%": (lambda m: RandomBlock(ratio=0.01, seed=1, **named(m)), 0.0),
        "TopK 1%": (lambda m: TopK(ratio=0.01, exchange="allgather", **named(m)), 0.9),
        "TopK 1% no feedback": (
            lambda m: TopK(ratio=0.01, error_feedback=False, exchange="allgather", **named(m)),
            0.9,
        ),
    }


# --- digits -------------------------------------------------------------------------------


def digits_data():
    """((train x, train y), (test x, test y), the data's provenance)."""
    import sklearn
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    data = {
        "source": f"scikit-learn {sklearn.__version__} load_digits",
        "sha256": hashlib.sha256(np.ascontiguousarray(x).tobytes() + np.ascontiguousarray(y).tobytes()).hexdigest(),
    }
    x = torch.tensor(x / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8)
    order = np.random.default_rng(0).permutation(len(y))
    test, train = order[:360], order[360:]
    return (x[train], torch.tensor(y[train])), (x[test], torch.tensor(y[test])), data


def digits_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(512, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


# --- character-level language model -----------------------------------------------------


def corpus(limit=600_000):
    """(bytes of the standard library's .py sources (ASCII, tabs/newlines kept), in sorted file
    order, up to `limit` bytes, as a tensor; their provenance): a real corpus every Python
    installation ships. The files change between Python releases, and so do the losses (RTopK's
    final loss moved by 12% between two machines' corpora), so every record names its text: the
    Python, the files read and the text's sha256."""
    stdlib = os.path.dirname(os.__file__)
    text, files = bytearray(), []
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        with open(path, "rb") as f:
            text += bytes(b if 32 <= b < 127 or b in (9, 10) else 32 for b in f.read())
        files.append(os.path.basename(path))
        if len(text) >= limit:
            break
    text = bytes(text[:limit])
    data = {
        "source": f"Python {platform.python_version()} standard library, {files[0]} to {files[-1]} "
        f"({len(files)} files)",
        "sha256": hashlib.sha256(text).hexdigest(),
    }
    return torch.tensor(list(text), dtype=torch.long), data


class CharGRU(torch.nn.Module):
    def __init__(self, vocab=128, embed=64, hidden=192):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, embed)
        self.gru = torch.nn.GRU(embed, hidden, batch_first=True)
        self.out = torch.nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.out(self.gru(self.embed(x))[0])


SEQ = 64


def charlm_batches(text, batch, rank, size, epoch):
    """This rank's batches of one epoch: sequences at shuffled offsets, disjoint across ranks."""
    starts = torch.arange(0, len(text) - SEQ - 1, SEQ)
    starts = starts[torch.randperm(len(starts), generator=torch.Generator().manual_seed(epoch))]
    per_step = batch * size
    for first in range(0, len(starts) - per_step + 1, per_step):
        mine = starts[first + rank * batch : first + (rank + 1) * batch]
        idx = mine[:, None] + torch.arange(SEQ + 1)
        chunk = text[idx]
        yield chunk[:, :-1], chunk[:, 1:]


# --- training -----------------------------------------------------------------------------


def train(task, method, size, rank):
    settings = TASKS[task]
    if task == "digits":
        (x, y), (x_test, y_test), data = digits_data()
        model = digits_model()
        shard = torch.arange(rank, len(y), size)
        steps_per_epoch = len(shard) // settings["batch"]
    else:
        text, data = corpus()
        split = int(0.9 * len(text))
        train_text, valid_text = text[:split], text[split:]
        model = CharGRU()
        steps_per_epoch = (len(train_text) // SEQ) // (settings["batch"] * size)
    make, momentum = methods(task, steps_per_epoch)[method]
    compression = make(model)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=settings["lr"], momentum=momentum),
        named_parameters=model.named_parameters(),
        compression=compression,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    curve = []
    for epoch in range(settings["epochs"]):
        model.train()
        if task == "digits":
            order = shard[torch.randperm(len(shard), generator=torch.Generator().manual_seed(epoch))]
            batches = (
                (x[order[i : i + settings["batch"]]], y[order[i : i + settings["batch"]]])
                for i in range(0, steps_per_epoch * settings["batch"], settings["batch"])
            )
        else:
            batches = charlm_batches(train_text, settings["batch"], rank, size, epoch)
        for inputs, targets in batches:
            opt.zero_grad()
            logits = model(inputs)
            torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            if task == "digits":
                curve.append(float((model(x_test).argmax(1) == y_test).float().mean()))
            else:
                chunk = valid_text[: len(valid_text) // (SEQ + 1) * (SEQ + 1)].reshape(-1, SEQ + 1)
                logits = model(chunk[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1))
                curve.append(float(loss))
        if not all(math.isfinite(v) for v in curve):
            break
    stats = compression.stats() if hasattr(compression, "stats") else None
    dense = sum(p.numel() for p in model.parameters()) * 4
    sent = stats["sent_bytes"] / max(1, stats["calls"]) * len(list(model.parameters())) if stats else dense
    return {
        "task": task,
        "method": method,
        "ranks": size,
        "metric": "accuracy" if task == "digits" else "val_loss",
        "curve": curve,
        "final": curve[-1],
        "sent_bytes_per_step": sent,
        "dense_bytes_per_step": dense,
        "epochs": settings["epochs"],
        "data": data,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", choices=list(TASKS), required=True)
    parser.add_argument("--methods", nargs="+")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    if args.epochs:
        TASKS[args.task]["epochs"] = args.epochs
    names = args.methods or list(methods(args.task, 1))
    records = []
    for method in names:
        records.append(train(args.task, method, hvd.size(), hvd.rank()))
        if hvd.rank() == 0:
            print(
                f"[convergence] {args.task} {method:<22} final {records[-1]['metric']} {records[-1]['final']:.4f}",
                flush=True,
            )
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
