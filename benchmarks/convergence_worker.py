"""Worker of the convergence benchmark (run by benchmarks under horovodrun): dense vs
each method at the papers' settings, same seeds, data order and epochs, on real data that
ships offline:

  digits   a small CNN on scikit-learn's digits (1,437 train / 360 held-out 8x8 images);
           test accuracy after each epoch.
  charlm   a character-level GRU language model on the Python standard library's sources
           (the first 600 kB of its .py files in sorted order; the last 10% held out);
           validation loss (nats per character) after each epoch.
  wordlm   a word-level GRU language model on the Wikipedia sample gensim's wheel ships for
           its tests (its first 250k words, as gensim's parser reads them; the last 10% held
           out); validation loss (nats per word) after each epoch.

Each rank trains on its own shard; the curves are rank 0's (the ranks stay identical).

Every row trains on the same schedule, so that the compression is all that differs between
rows: the learning rate rises linearly over the task's warm-up epochs (DGC's density warm-up
runs over the same steps), the averaged gradient is clipped to the task's clip_norm (DGC
clips locally instead, at clip_norm / sqrt(N), its paper's version of the same rule), and
a seed (--seeds: each in turn) sets the model's initial weights and the data order.
"""

import argparse
import collections
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

TASKS = {  # epochs, batch per rank, learning rate, warm-up epochs (every row) and clipping norm
    "digits": dict(epochs=30, batch=16, lr=0.05, warmup_epochs=4, clip_norm=None),
    "charlm": dict(epochs=6, batch=16, lr=0.25, warmup_epochs=1, clip_norm=1.0),
    "wordlm": dict(epochs=6, batch=16, lr=0.5, warmup_epochs=1, clip_norm=1.0),
}


def warmup_epochs(task):
    """The task's warm-up epochs, at most a quarter of its training (a shortened run, such as
    the demo's test, still trains at its full learning rate for most of it)."""
    settings = TASKS[task]
    return min(settings["warmup_epochs"], settings["epochs"] / 4)


def methods(task, steps_per_epoch):
    """name -> (compression(model), optimizer momentum). The paper settings: DGC at 0.1% with
    its momentum and a 4-stage warm-up (also with the official code's Nesterov momentum);
    gradient dropping at 1% (with and without 2-bit values) and at 0.1% with 2-bit values;
    rTop-k; random-block; top-k with and without error feedback."""
    warmup = round(warmup_epochs(task) * steps_per_epoch)
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
        "DGC 0.1% Nesterov": (
            lambda m: DGC(
                ratio=0.001,
                momentum=0.9,
                nesterov=True,
                warmup_steps=warmup,
                exchange="allgather",
                clip_norm=TASKS[task]["clip_norm"],
                **named(m),
            ),
            0.0,
        ),
        "Threshold 1%": (lambda m: Threshold(ratio=0.01, exchange="allgather", **named(m)), 0.9),
        "Threshold 1% 2bit": (lambda m: Threshold(ratio=0.01, quantize="2bit", exchange="allgather", **named(m)), 0.9),
        # where 1% spans too wide a range for 2 bits (a word model's embedding: docs/threshold.md)
        "Threshold 0.1% 2bit": (
            lambda m: Threshold(ratio=0.001, quantize="2bit", exchange="allgather", **named(m)),
            0.9,
        ),
        "RTopK 1% of 1.25%": (lambda m: RTopK(ratio=0.01, r=0.0125, seed=1, exchange="allgather", **named(m)), 0.9),
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


def digits_model(seed=0):
    torch.manual_seed(seed)
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


# --- word-level language model -------------------------------------------------------------

WORD_VOCAB = 5000  # the training text's most frequent words; the rest share the last id (unknown)
WIKI_SAMPLE = ("test", "test_data", "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")


def word_corpus(limit=250_000):
    """(the word ids of the first `limit` words of the Wikipedia sample gensim's wheel ships for
    its tests, their provenance). gensim's own parser reads it: articles in file order, redirects
    skipped, markup filtered, lowercased words of 2 to 15 letters. Ids rank the words of the first
    90% (the training part) by count, ties in order of appearance."""
    import bz2
    from importlib.util import find_spec

    if find_spec("gensim") is None:
        raise ModuleNotFoundError("the wordlm task reads gensim's Wikipedia sample: pip install 'gensim>=4.4,<5'")
    import gensim
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki, tokenize

    words, articles = [], 0
    with bz2.BZ2File(os.path.join(gensim.__path__[0], *WIKI_SAMPLE)) as f:
        for _, text, _ in extract_pages(f, filter_namespaces=("0",)):
            if len(words) >= limit:
                break
            if not text.lower().startswith("#redirect"):
                words += tokenize(filter_wiki(text), lower=True)
                articles += 1
    words = words[:limit]
    counts = collections.Counter(words[: int(0.9 * len(words))])
    ids = {word: i for i, (word, _) in enumerate(counts.most_common(WORD_VOCAB - 1))}
    data = {
        "source": f"gensim {gensim.__version__} test data: Wikipedia, {articles} articles, {len(words):,} words",
        "sha256": hashlib.sha256(" ".join(words).encode()).hexdigest(),
    }
    return torch.tensor([ids.get(word, WORD_VOCAB - 1) for word in words]), data


class GRULanguageModel(torch.nn.Module):
    def __init__(self, vocab=128, embed=64, hidden=192, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(vocab, embed)
        self.gru = torch.nn.GRU(embed, hidden, batch_first=True)
        self.out = torch.nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.out(self.gru(self.embed(x))[0])


SEQ = 64  # characters a sequence; WORD_SEQ words
WORD_SEQ = 35


def epoch_order(n, epoch, seed):
    """A permutation of range(n) for one epoch (seed 0 keeps the orders of the earlier records)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(1000 * seed + epoch))


def text_batches(text, batch, rank, size, epoch, seed=0, seq=SEQ):
    """This rank's batches of one epoch: sequences at shuffled offsets, disjoint across ranks."""
    starts = torch.arange(0, len(text) - seq - 1, seq)
    starts = starts[epoch_order(len(starts), epoch, seed)]
    per_step = batch * size
    for first in range(0, len(starts) - per_step + 1, per_step):
        mine = starts[first + rank * batch : first + (rank + 1) * batch]
        idx = mine[:, None] + torch.arange(seq + 1)
        chunk = text[idx]
        yield chunk[:, :-1], chunk[:, 1:]


# --- training -----------------------------------------------------------------------------


class Digits:
    """The digits task of one rank: its shard, batches and the test accuracy."""

    metric = "accuracy"

    def __init__(self, batch, rank, size, seed):
        (self.x, self.y), (self.x_test, self.y_test), self.data = digits_data()
        self.model, self.batch, self.seed = digits_model(seed), batch, seed
        self.shard = torch.arange(rank, len(self.y), size)
        self.steps_per_epoch = len(self.shard) // batch

    def batches(self, epoch):
        order = self.shard[epoch_order(len(self.shard), epoch, self.seed)]
        for i in range(0, self.steps_per_epoch * self.batch, self.batch):
            yield self.x[order[i : i + self.batch]], self.y[order[i : i + self.batch]]

    def evaluate(self):
        return float((self.model(self.x_test).argmax(1) == self.y_test).float().mean())


LANGUAGE_MODELS = {  # the task's text, vocabulary, GRU hidden size and sequence length
    "charlm": (corpus, 128, 192, SEQ),
    "wordlm": (word_corpus, WORD_VOCAB, 128, WORD_SEQ),
}


class LanguageModelTask:
    """A language-model task of one rank (charlm or wordlm): its sequences and the validation
    loss, in chunks of rows (a word model's logits of the whole held-out text would not fit)."""

    metric = "val_loss"

    def __init__(self, task, batch, rank, size, seed):
        read, vocab, hidden, self.seq = LANGUAGE_MODELS[task]
        text, self.data = read()
        split = int(0.9 * len(text))
        self.train_text, valid = text[:split], text[split:]
        self.valid = valid[: len(valid) // (self.seq + 1) * (self.seq + 1)].reshape(-1, self.seq + 1)
        self.model = GRULanguageModel(vocab, 64, hidden, seed)
        self.batch, self.rank, self.size, self.seed = batch, rank, size, seed
        self.steps_per_epoch = (len(self.train_text) // self.seq) // (batch * size)

    def batches(self, epoch):
        return text_batches(self.train_text, self.batch, self.rank, self.size, epoch, self.seed, self.seq)

    def evaluate(self, rows=256):
        total = sum(
            float(loss_of(self.model(chunk[:, :-1]), chunk[:, 1:], reduction="sum")) for chunk in self.valid.split(rows)
        )
        return total / self.valid[:, 1:].numel()


def loss_of(logits, targets, reduction="mean"):
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction
    )


def warmed_up(opt, warmup_steps):
    """The learning rate rising linearly to its value over `warmup_steps` steps, then constant."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / max(1, warmup_steps)))


def step(opt, clip_norm, params):
    """One optimizer step on the averaged gradient, clipped to clip_norm first where given
    (Horovod's recipe: synchronize, clip, then step without synchronizing again)."""
    if clip_norm is None:
        opt.step()
        return
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(params, clip_norm)
    with opt.skip_synchronize():
        opt.step()


def run_epochs(model, work, opt, schedule, epochs, update):
    """The metric after each epoch of training `model` on `work` (`update`: the optimizer's step);
    a run whose metric stops being finite ends there."""
    curve = []
    for epoch in range(epochs):
        model.train()
        for inputs, targets in work.batches(epoch):
            opt.zero_grad()
            loss_of(model(inputs), targets).backward()
            update()
            schedule.step()
        model.eval()
        with torch.no_grad():
            curve.append(work.evaluate())
        if not all(math.isfinite(v) for v in curve):
            break
    return curve


def train(task, method, size, rank, seed=0):
    settings = TASKS[task]
    if task == "digits":
        work = Digits(settings["batch"], rank, size, seed)
    else:
        work = LanguageModelTask(task, settings["batch"], rank, size, seed)
    model = work.model
    make, momentum = methods(task, work.steps_per_epoch)[method]
    compression = make(model)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=settings["lr"], momentum=momentum),
        named_parameters=model.named_parameters(),
        compression=compression,
    )
    schedule = warmed_up(opt, round(warmup_epochs(task) * work.steps_per_epoch))
    clip_norm = None if method.startswith("DGC") else settings["clip_norm"]  # DGC clips in the compressor
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    curve = run_epochs(model, work, opt, schedule, settings["epochs"], lambda: step(opt, clip_norm, model.parameters()))
    stats = compression.stats() if hasattr(compression, "stats") else None
    dense = sum(p.numel() for p in model.parameters()) * 4
    sent = stats["sent_bytes"] / max(1, stats["calls"]) * len(list(model.parameters())) if stats else dense
    return {
        "task": task,
        "method": method,
        "ranks": size,
        "seed": seed,
        "metric": work.metric,
        "curve": curve,
        "final": curve[-1],
        "sent_bytes_per_step": sent,
        "dense_bytes_per_step": dense,
        "epochs": settings["epochs"],
        "schedule": dict(lr=settings["lr"], warmup_epochs=warmup_epochs(task), clip_norm=settings["clip_norm"]),
        "data": work.data,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", choices=list(TASKS), required=True)
    parser.add_argument("--methods", nargs="+")
    parser.add_argument("--epochs", type=int)
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0], help="one after another; each sets the weights and data order"
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    if args.epochs:
        TASKS[args.task]["epochs"] = args.epochs
    names = args.methods or list(methods(args.task, 1))
    records = []
    for seed in args.seeds:
        for method in names:
            records.append(train(args.task, method, hvd.size(), hvd.rank(), seed))
            if hvd.rank() == 0:
                print(
                    f"[convergence] {args.task} {method:<22} seed {seed} final {records[-1]['metric']} "
                    f"{records[-1]['final']:.4f}",
                    flush=True,
                )
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
