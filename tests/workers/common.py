"""What the multi-rank workers and the single-process references share: the data
(scikit-learn's digits, real 8x8 images), which rows each rank reads at each step, and the
model, the workers' command line and compressors, and the elastic tests' scenario. Neither is code
under test."""

import argparse
import functools
import gc
import hashlib
import importlib
import os
import sys
import time

import numpy as np

# The workers beside this file are short jobs whose imports (torch or TF, Horovod) make most of
# their objects, which each full collection walks (docs/testing.md); soak.py sets Python's back.
PYTHON_GC_THRESHOLDS = gc.get_threshold()
if os.path.dirname(os.path.abspath(sys.argv[0])) == os.path.dirname(os.path.abspath(__file__)):
    gc.set_threshold(100_000, 50, 100)

BATCH = 16
# the file where digits() are saved, if any (save_digits)
DIGITS_FILE = "SPARSECOMM_TEST_DIGITS"
# Compressor policy for tests that compress every tensor, however small (the default policy
# sends small and 1-D tensors dense; it has tests of its own).
EVERY = dict(min_numel=0, dense_1d=False)
# torch_train.py's configs also run with each tensor prepared alone (the compressor's grouping of
# Horovod's tensors off: the per-tensor path), which must train bit for bit alike
ONE_BY_ONE = ("topk_0.1", "threshold_0.1", "dgc_0.1", "dgc_0.05_warmup_clip", "rtopk_0.1", "threshold_0.1_2bit")


def worker_parser(steps=None, lr=None):
    """A worker's command line: --out, the folder it saves to; with `steps`, --steps (that default)
    and with `lr`, --lr (that default). A worker adds its own arguments before parse_args()."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    if steps is not None:
        parser.add_argument("--steps", type=int, default=steps)
    if lr is not None:
        parser.add_argument("--lr", type=float, default=lr)
    return parser


def add_sizes_argument(parser):
    """--sizes N ...: run on the first N ranks, for each N (sizes_of)."""
    parser.add_argument("--sizes", type=int, nargs="+", help="runs on the first N ranks, for each N (default: all)")
    return parser


def sizes_of(hvd, sizes, **init):
    """hvd.init(**init), with a process set of the first N ranks for each N of `sizes` below the
    job's size: {N: that set, or the global set for the job's size}. for_each_size runs them one
    after another, so that one launch covers several sizes (a launch, and each rank's start,
    cost more than most workers' runs)."""
    if not sizes:
        hvd.init(**init)
        return {hvd.size(): hvd.global_process_set}
    world = int(os.environ["HOROVOD_SIZE"])
    sets = {n: hvd.ProcessSet(list(range(n))) for n in sizes if n != world}
    hvd.init(process_sets=list(sets.values()), **init)
    return {n: sets.get(n, hvd.global_process_set) for n in sizes}


def set_arguments(hvd, process_set):
    """The process_set= of a compressor, an optimizer or a collective: none for the whole job (the
    default a user leaves), else the set."""
    return {} if process_set is hvd.global_process_set else {"process_set": process_set}


def broadcast_torch_model(hvd, model, process_set):
    """Rank 0's parameters to every rank of `process_set`: hvd.broadcast_parameters, as Horovod's
    recipe writes it, for the whole job; tensor by tensor in a set (Horovod 0.28.1's
    broadcast_parameters takes no process set)."""
    if process_set is hvd.global_process_set:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return
    for name, tensor in model.state_dict().items():
        hvd.broadcast_(tensor, root_rank=0, name=f"broadcast.{name}", process_set=process_set)


def for_each_size(hvd, sets, run, zeros):
    """run(size, process_set) on each set this rank is in, one after another; then every rank
    meets in an allreduce of `zeros` (Horovod shuts down as soon as any rank ends)."""
    for size, process_set in sets.items():
        if process_set.included():
            run(size, process_set)
    hvd.allreduce(zeros, name="sizes.done")


def size_folder(out, size):
    """Where a worker run by sizes saves the ranks of `size` (launch.saved_sizes reads it)."""
    folder = os.path.join(out, f"np{size}")
    os.makedirs(folder, exist_ok=True)
    return folder


def start_torch(sizes=None, **init):
    """hvd.init(**init) for a torch worker, on one thread: the ranks share this machine's cores.
    Returns sizes_of's sets of `sizes`."""
    import horovod.torch as hvd
    import torch

    sets = sizes_of(hvd, sizes, **init)
    torch.set_num_threads(1)
    return sets


def train_compressors(sc):
    """The compressors both training workers run (torch_train.py, tf_train.py: each adds configs of its
    own), from the framework's module (sparsecomm.torch or sparsecomm.tensorflow): config ->
    make(binding kwargs). Under the default policy 0.bias, 2.weight (320 elements) and 2.bias go dense
    (1-D, or under 1024 elements), DGC's with its momentum."""
    gathered = dict(exchange="allgather", **EVERY)
    return {
        "random_block_0.1": lambda kw: sc.RandomBlock(ratio=0.1, seed=7, **EVERY, **kw),
        "random_block_1.0": lambda kw: sc.RandomBlock(ratio=1.0, seed=7, **EVERY, **kw),
        "randomk_0.1": lambda kw: sc.RandomK(ratio=0.1, seed=7, **EVERY, **kw),
        "randomk_1.0": lambda kw: sc.RandomK(ratio=1.0, seed=7, **EVERY, **kw),
        "topk_0.1": lambda kw: sc.TopK(ratio=0.1, **gathered, **kw),
        "topk_1.0": lambda kw: sc.TopK(ratio=1.0, dense_fallback=False, **gathered, **kw),
        "topk_0.1_no_feedback": lambda kw: sc.TopK(ratio=0.1, error_feedback=False, **gathered, **kw),
        "topk_0.1_default_policy": lambda kw: sc.TopK(exchange="allgather", ratio=0.1, **kw),
        "rtopk_0.1": lambda kw: sc.RTopK(ratio=0.1, r=0.3, seed=7, **gathered, **kw),
        "rtopk_1.0": lambda kw: sc.RTopK(ratio=1.0, seed=7, dense_fallback=False, **gathered, **kw),
        "threshold_0.1": lambda kw: sc.Threshold(ratio=0.1, **gathered, **kw),
        "threshold_1.0": lambda kw: sc.Threshold(ratio=1.0, dense_fallback=False, **gathered, **kw),
        "threshold_0.1_fp16": lambda kw: sc.Threshold(ratio=0.1, quantize="fp16", **gathered, **kw),
        "threshold_0.1_1bit": lambda kw: sc.Threshold(ratio=0.1, quantize="1bit", **gathered, **kw),
        "threshold_0.1_2bit": lambda kw: sc.Threshold(ratio=0.1, quantize="2bit", **gathered, **kw),
        "dgc_0.1": lambda kw: sc.DGC(ratio=0.1, momentum=0.9, **gathered, **kw),
        "dgc_0.05_warmup_clip": lambda kw: sc.DGC(
            ratio=0.05, momentum=0.9, warmup_steps=4, warmup_stages=2, clip_norm=0.2, **gathered, **kw
        ),
        # warm-up stage 0 has density 0.71: sparse (6-byte rows) would be larger, so it goes dense
        # (momentum SGD); then 0.5, sparse
        "dgc_0.5_warmup_dense_stage": lambda kw: sc.DGC(
            ratio=0.5, momentum=0.9, warmup_steps=2, warmup_stages=1, **gathered, **kw
        ),
        "dgc_1.0_no_masking": lambda kw: sc.DGC(
            ratio=1.0, momentum=0.9, momentum_masking=False, dense_fallback=False, **gathered, **kw
        ),
        "dgc_0.1_default_policy": lambda kw: sc.DGC(exchange="allgather", ratio=0.1, momentum=0.9, **kw),
        # the same with clipping: the dense route's momentum pass reads the clipping factor too
        "dgc_0.1_default_policy_clip": lambda kw: sc.DGC(
            exchange="allgather", ratio=0.1, momentum=0.9, clip_norm=0.2, **kw
        ),
        # Nesterov momentum on the default policy: a sparse tensor and the dense route's momentum pass
        "dgc_0.1_nesterov": lambda kw: sc.DGC(exchange="allgather", ratio=0.1, momentum=0.9, nesterov=True, **kw),
    }


def hot_path_compressors(sc, ratio):
    """The compressors whose compress and decompress the hot-path workers watch (torch_allocations.py,
    torch_host_reads.py: each adds its own), at `ratio`, from sparsecomm.torch (`sc`): config ->
    make(model)."""
    named = lambda m: dict(named_parameters=m.named_parameters(), **EVERY)  # noqa: E731
    return {
        "RandomBlock": lambda m: sc.RandomBlock(ratio=ratio, **named(m)),
        "RandomK": lambda m: sc.RandomK(ratio=ratio, **named(m)),
        "TopK_allgather": lambda m: sc.TopK(ratio=ratio, exchange="allgather", **named(m)),
        "RTopK_allgather": lambda m: sc.RTopK(ratio=ratio, exchange="allgather", **named(m)),
        "Threshold_allgather": lambda m: sc.Threshold(ratio=ratio, exchange="allgather", **named(m)),
        "Threshold_2bit": lambda m: sc.Threshold(ratio=ratio, quantize="2bit", exchange="allgather", **named(m)),
        "DGC_allgather_clipped": lambda m: sc.DGC(ratio=ratio, clip_norm=1e-3, exchange="allgather", **named(m)),
        "DGC_spardl": lambda m: sc.DGC(ratio=ratio, exchange="spardl", **named(m)),
        "TopK_spardl": lambda m: sc.TopK(ratio=ratio, exchange="spardl", **named(m)),
    }


def loss_scale_configs(framework):
    """The six compressors of the loss-scale tests (tests/workers/*_loss_scale.py), from the
    framework's module (sparsecomm.torch or sparsecomm.tensorflow): config -> make(binding kwargs).
    DGC keeps the default policy: its 1-D tensors and the 32x10 output weight (320 elements)
    go dense with its momentum."""
    sc = framework
    return {
        "dgc": lambda kw: sc.DGC(
            exchange="allgather", ratio=0.1, momentum=0.9, warmup_steps=4, warmup_stages=2, clip_norm=0.5, **kw
        ),
        "threshold_2bit": lambda kw: sc.Threshold(exchange="allgather", ratio=0.1, quantize="2bit", **EVERY, **kw),
        "topk_spardl": lambda kw: sc.TopK(exchange="spardl", ratio=0.1, **EVERY, **kw),
        "rtopk": lambda kw: sc.RTopK(exchange="allgather", ratio=0.05, r=0.2, seed=7, **EVERY, **kw),
        "randomk": lambda kw: sc.RandomK(ratio=0.1, seed=7, **EVERY, **kw),
        "random_block": lambda kw: sc.RandomBlock(ratio=0.1, seed=7, **EVERY, **kw),
    }


# The loss-scale workers' forced overflow: rank 1's gradient element set to inf at one step.
POISONED = ("0.weight", (5, 7))


def poison(run, overflow):
    """The forced overflow on `run` (a loss-scale worker's Run: its model, scaler and step): at
    step `overflow` of a scaled run, POISONED's gradient element becomes inf (call on rank 1)."""
    name, where = POISONED

    def hook(grad):
        if run.step != overflow or run.scaler is None:
            return grad
        grad = grad.clone()
        grad[where] = float("inf")
        return grad

    dict(run.model.named_parameters())[name].register_hook(hook)


def digits():
    """(x, y) of scikit-learn's digits: copies of the ones loaded once a process (a simulation of
    N ranks asks for them every step of every rank; the load takes 5 ms)."""
    x, y = _loaded_digits()
    return x.copy(), y.copy()


@functools.cache
def _loaded_digits():
    saved = os.environ.get(DIGITS_FILE)
    if saved:
        with np.load(saved) as arrays:
            return arrays["x"], arrays["y"]
    # run alone: scikit-learn from the benchmarks' packages (benchmarks/requirements.txt)
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    importlib.import_module("benchmarks")
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)


def save_digits(path):
    """Writes digits() to `path` for the processes that find it in DIGITS_FILE: they skip importing
    scikit-learn (tests/conftest.py saves them once a session; docs/testing.md says what it saves)."""
    x, y = _loaded_digits()
    np.savez(path, x=x, y=y)


def rows(step, rank, size, n_rows, batch=BATCH):
    """The rows rank `rank` of `size` reads at `step`: disjoint across ranks."""
    first = (step * size + rank) * batch
    return np.arange(first, first + batch) % n_rows


def torch_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def torch_frozen_model():
    """Three linear layers, the first frozen (its parameters get no gradient)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 33), torch.nn.ReLU(), torch.nn.Linear(33, 10)
    )
    model[0].requires_grad_(False)
    return model


def torch_model_with_spare():
    """The same MLP (same initial weights) plus a parameter that never gets a gradient."""
    import torch

    class WithSpare(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch_model()
            self.spare = torch.nn.Linear(40, 40)  # 1,640 parameters outside the forward pass

        def forward(self, x):
            return self.body(x)

    return WithSpare()


def torch_bag_model():
    """A bag of embeddings over digits: each pixel (0..16) at each of the 64 positions is a
    token; a sparse Embedding (sparse gradients) then a Linear layer."""
    import torch

    class Bag(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embedding = torch.nn.Embedding(17 * 64, 8, sparse=True)
            self.out = torch.nn.Linear(8, 10)

        def forward(self, x):
            tokens = (x * 16).round().long() + 17 * torch.arange(64)
            return self.out(self.embedding(tokens).sum(1))

    return Bag()


def uses_branch(step, rank):
    """Whether rank `rank` runs the everyday model's optional branch at `step`: every rank on
    steps 0, 3, ...; only rank 0 on steps 1, 4, ...; no rank on steps 2, 5, ..."""
    return step % 3 == 0 or (step % 3 == 1 and rank == 0)


def torch_everyday_model():
    """A model with what everyday models have: an embedding tied to the output layer (one
    Parameter in two modules; named_parameters() lists it once, as embedding.weight), a
    frozen layer (requires_grad=False) and a branch that runs only on some steps
    (uses_branch), so its .grad stays None there. Reads digits as 64 tokens (pixel values
    0..16) and predicts the label among 17 logits."""
    import torch

    class Everyday(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embedding = torch.nn.Embedding(17, 24)
            self.frozen = torch.nn.Linear(24, 24).requires_grad_(False)
            self.hidden = torch.nn.Linear(24, 24)
            self.branch = torch.nn.Linear(24, 24)
            self.out = torch.nn.Linear(24, 17)
            self.out.weight = self.embedding.weight  # tied

        def forward(self, x, branch=True):
            h = self.embedding((x * 16).round().long()).mean(1)
            h = torch.relu(self.hidden(torch.tanh(self.frozen(h))))
            if branch:
                h = h + torch.tanh(self.branch(h))
            return self.out(h)

    return Everyday()


# A burst of non-finite values: rank 1's gradient at BURST_STEP gets these (flat coordinate ->
# value); every other gradient is finite.
BURST_SHAPE, BURST_STEPS, BURST_STEP = (64, 64), 16, 2
BURST = {5: float("nan"), 700: float("inf"), 2100: float("-inf"), 4000: float("nan")}
BURST_RANDOM_RATIO = 0.2  # RandomK and RandomBlock: each coordinate drawn at 1 step in 5


def burst_gradient(step, rank, shape=BURST_SHAPE):
    """A float32 normal gradient of `shape`, seeded by (step, rank), with BURST on rank 1 at
    BURST_STEP."""
    grad = np.random.default_rng([step, rank]).standard_normal(shape).astype(np.float32)
    if step == BURST_STEP and rank == 1:
        grad.reshape(-1)[list(BURST)] = list(BURST.values())
    return grad


def digest(arrays):
    """A short hash of the arrays' bytes, in order: equal on every rank when they hold the same bits."""
    return hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()[:16]


def same_everywhere(hvd, mine, what, step):
    """The elastic workers' checks: raises on this rank unless every rank holds `mine`."""
    everyone = hvd.allgather_object(mine, name=f"check {what}")
    if any(other != mine for other in everyone):
        raise AssertionError(f"ranks disagree on {what} at step {step}: {everyone}")


def elastic_compressors(sc):
    """The elastic workers' compressors, in the order they step (torch_elastic.py, tf_elastic.py; three
    of them in tf_keras_elastic.py), from the framework's module: method -> make(binding kwargs)."""
    return {
        "DGC": lambda kw: sc.DGC(ratio=0.05, warmup_steps=4, **EVERY, **kw),
        "Threshold": lambda kw: sc.Threshold(ratio=0.05, exchange="spardl", **EVERY, **kw),
        "TopK": lambda kw: sc.TopK(ratio=0.05, exchange="allgather", **EVERY, **kw),
        "RTopK": lambda kw: sc.RTopK(ratio=0.05, seed=3, exchange="allgather", **EVERY, **kw),
        "RandomK": lambda kw: sc.RandomK(ratio=0.05, seed=5, **EVERY, **kw),
        "RandomBlock": lambda kw: sc.RandomBlock(ratio=0.05, seed=7, **EVERY, **kw),
    }


def check_counted(hvd, state, steps, counts, exact=True):
    """The elastic workers' check after a step: every rank holds the same compressor `steps` and (with
    `exact`) each compressor counted exactly the committed steps and this one (`counts`: the step
    counts in `steps`)."""
    if exact and any(count != state.step + 1 for count in counts):
        raise AssertionError(f"rank {hvd.rank()}: compressor steps {steps} after step {state.step}")
    same_everywhere(hvd, steps, "compressor steps", state.step)


def elastic_args(recipe=None):
    """An elastic worker's command line: --hosts and --fail (ElasticScenario's) and, given `recipe`
    (what --recipe horovod leaves out of the state), --recipe."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", required=True, help="the file the host discovery script prints")
    parser.add_argument("--fail", action="store_true", help="shrink by a rank dying mid-step, not by discovery")
    if recipe is not None:
        choices = ("horovod", "sparsecomm")
        parser.add_argument("--recipe", choices=choices, default="sparsecomm", help=f"horovod: {recipe}")
    return parser.parse_args()


def tf_residual_norm(compressors):
    """The sum of |residual| over the TF compressors' variables (the elastic workers log it)."""
    import tensorflow as tf

    return sum(float(tf.reduce_sum(tf.abs(s.residual))) for c in compressors for s in c.state if s.residual is not None)


class ElasticScenario:
    """The scenario of the elastic workers (torch_elastic.py, tf_elastic.py), played from the
    elastic state's `step`, `phase` and `mark`: 2 ranks train; at step 3 rank 0 adds a third slot
    to the hosts file; 3 steps after the third rank joined, it leaves: rank 0 removes the slot,
    or (`fail`) the third rank dies in the middle of that step; 3 steps after the shrink, done."""

    def __init__(self, hosts, fail):
        self.hosts, self.fail = hosts, fail
        self.born = time.monotonic()

    def steps(self, state, hvd, examples, agreed, joined, residual_norm):
        """The steps of one `train` call (Horovod calls it again after every reset), as the rows
        this rank reads: before each, `agreed()` checks the ranks agree, the world is logged the
        first time this call sees its size, and the phase moves on; after each, the step is
        committed. Ends when training is over; raises if a phase never ends (240 s)."""
        seen = None
        while True:
            size = hvd.size()
            agreed()
            if size != seen:
                seen = size
                print(
                    f"world: rank {hvd.rank()} of {size} at step {state.step} joined {joined} "
                    f"residual {residual_norm():.6g}",
                    flush=True,
                )
            if self.finished(state, hvd.rank(), size):
                return
            yield rows(state.step, hvd.rank(), hvd.size(), examples)
            state.step += 1
            state.commit()
            time.sleep(0.05 if state.phase != "finish" else 0)
            if time.monotonic() - self.born > 240:
                raise RuntimeError(f"phase {state.phase} never ended (size {hvd.size()})")

    def log_resets(self, state, hvd):
        """Prints a line at every reset of the elastic `state`, for whoever reads the ranks' output."""
        state.register_reset_callbacks(
            [lambda: print(f"reset: rank {hvd.rank()} of {hvd.size()} at step {state.step}", flush=True)]
        )

    def write_hosts(self, slots):
        # The third slot is on a second "host" (127.0.0.1, also this machine): Horovod blacklists
        # the host of a failed worker, which must not be the host of the others.
        # Written whole, then renamed: a discovery between truncation and write would see no hosts,
        # which Horovod takes for every host removed.
        with open(f"{self.hosts}.new", "w") as f:
            f.write("localhost:2\n" + ("127.0.0.1:1\n" if slots == 3 else ""))
        os.replace(f"{self.hosts}.new", self.hosts)

    def finished(self, state, rank, size):
        """Moves the phase on at the start of a step; True when training is over."""
        if state.phase == "grow" and size == 3:
            state.phase, state.mark = "shrink", state.step
        if state.phase == "shrink" and size == 2:
            state.phase, state.mark = "finish", state.step
        if state.phase == "grow" and state.step == 3 and rank == 0:
            self.write_hosts(3)
        if self.leaving(state) and not self.fail and rank == 0:
            self.write_hosts(2)
        return state.phase == "finish" and state.step >= state.mark + 3

    def leaving(self, state):
        return state.phase == "shrink" and state.step == state.mark + 3

    def die_if_due(self, state, rank):
        """With `fail`: the third rank dies here (called in the middle of the step)."""
        if self.fail and self.leaving(state) and rank == 2:
            print(f"rank 2 dies at step {state.step}", flush=True)
            os._exit(1)


def train_recorded(configs, dtypes, steps, lr, process_set=None):
    """SGD steps of the digits MLP under hvd.DistributedOptimizer for each config (name -> a
    function of the model giving its compression, given process_set= where `process_set` is not
    the whole job; dtypes: name -> the model's dtype where not float32): every rank's local
    gradients (after backward, before the exchange), exchanged gradients and parameters after
    every step, and the compressor's final stats and residuals."""
    import horovod.torch as hvd
    import torch

    process_set = process_set or hvd.global_process_set
    on = set_arguments(hvd, process_set)
    x_all, y_all = digits()
    results = {}
    for config, make_compression in configs.items():
        dtype = dtypes.get(config, torch.float32)
        model = torch_model().to(dtype)
        compression = make_compression(model, **on)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=lr),
            named_parameters=model.named_parameters(),
            compression=compression,
            **on,
        )
        grads, params, exchanged = [], [], []
        for step in range(steps):
            idx = rows(step, process_set.rank(), process_set.size(), len(y_all))
            opt.zero_grad()
            x = torch.from_numpy(x_all[idx]).to(dtype)
            torch.nn.functional.cross_entropy(model(x).float(), torch.from_numpy(y_all[idx])).backward()
            grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
            opt.synchronize()
            exchanged.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
            with opt.skip_synchronize():
                opt.step()
            params.append({n: p.detach().clone() for n, p in model.named_parameters()})
        results[config] = {"grads": grads, "params": params, "exchanged": exchanged}
        if hasattr(compression, "stats"):
            results[config]["stats"] = compression.stats()
            results[config]["residuals"] = {n: s.residual for n, s in compression.state.parameters.items()}
    return results
