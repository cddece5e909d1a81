"""Worker of the end-to-end benchmark (run by benchmarks.e2e under horovodrun, or one
process per rank in its own network namespace): step time of one model, on the same ranks and
network, for these rows. Medians over the timed steps, after warm-up steps, of the whole step and
of its phases (forward, backward, optimizer step: PHASES). With --rounds R
every row is built first and the rows are timed in R interleaved turns (floor, dense, ..., then
dense, ..., floor, ...): drift of the machine during the run then falls on every row alike. With
--group-size G as well, G rows at a time (rows that do not fit in memory together), the floor and
dense among them in every group. With --first-steps N, a row of a compressor with an exchange warms
up at least N steps, from its compressor freshly built, and its record keeps those N step times
(auto's watch and route trial among them: what a new job sees) and their means (`bench trial`).

  floor            the same step with NO gradient exchange (plain SGD, momentum 0.9, on each
                   rank's own gradient): the time no exchange method can beat
  floor synced     the floor with one 1-element allreduce between the backward pass and the
                   optimizer's step: nothing of the gradient is exchanged, but the ranks wait
                   for each other once a step, as every exchanging row must (on a busy machine
                   the slower rank's backward then sets the step, where the floor pays only
                   the slower rank's whole step)
  dense, ...       hvd.DistributedOptimizer with Horovod's compression or a sparsecomm method
  ... local        a method's compressor and optimizer on a process set of each rank alone:
                   every kernel and Horovod's cycle run, nothing is sent (the floor plus the
                   kernels: what the method's exchange could at best reach)
  DDP dense/fp16/PowerSGD
                   PyTorch DistributedDataParallel on the gloo backend, plain or with the
                   fp16 / PowerSGD (rank 4) communication hook: the peers outside Horovod
                   (every DDP row with gradient_as_bucket_view=True: no copy into the
                   buckets and back, about 12 ms a step on the comm model)
  DDP + DGC 0.1%, ...
                   DistributedDataParallel with a sparsecomm compressor as its communication
                   hook (sparsecomm.torch.ddp_hook): the Horovod row's method, settings and
                   optimizer, the other way in (DDP_HOOK_ROWS)

Models (data content does not change the step time, so inputs are fixed random tensors):
  comm     MLP 1024-4096-4096-1024 (25.2M parameters, 101 MB of float32 gradient), batch 8:
           little compute, a large gradient: communication dominates on a slow network.
  comm-small
           the comm model at a quarter, MLP 512-2048-2048-512 (6.3M parameters, 25 MB): the
           same exchanges for quick runs, such as the tests'.
  compute  a CNN on 32x32x3 images (0.29M parameters), batch 32: compute dominates.
"""

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import horovod.torch as hvd
import torch

from benchmarks.e2e import MLP_WIDTHS, MODELS, PHASES
from benchmarks.first_steps import means
from sparsecomm.core.plan import SETTLING_STEPS
from sparsecomm.torch import DGC, RandomBlock, Threshold, TopK, destroy_process_group, host_process_sets

FLOOR = "floor"
FLOOR_SYNCED = "floor synced"


def ours(cls, **settings):
    """A sparsecomm row's compression(model, process set): cls on the model's parameters."""
    return lambda model, process_set: cls(
        named_parameters=model.named_parameters(), process_set=process_set, **settings
    )


# name -> (compression(model, process set), optimizer momentum). Every row steps SGD with momentum
# 0.9, as the floor does, except DGC (its momentum correction is in the compressor) and
# RandomBlock (with optimizer momentum it diverges, docs/random_block.md): plain SGD, as users run them.
METHODS = {
    "dense": (lambda model, process_set: hvd.Compression.none, 0.9),
    "dense fp16": (lambda model, process_set: hvd.Compression.fp16, 0.9),
    "DGC 0.1% allgather": (ours(DGC, ratio=0.001, exchange="allgather"), 0),
    "DGC 0.1% spardl": (ours(DGC, ratio=0.001, exchange="spardl"), 0),
    "DGC 0.1% hierarchical": (ours(DGC, ratio=0.001, exchange="hierarchical"), 0),
    "DGC 0.1% auto": (ours(DGC, ratio=0.001), 0),
    "Threshold 1%": (ours(Threshold, ratio=0.01, exchange="allgather"), 0.9),
    "Threshold 1% 2bit": (ours(Threshold, ratio=0.01, quantize="2bit", exchange="allgather"), 0.9),
    "TopK 1%": (ours(TopK, ratio=0.01, exchange="allgather"), 0.9),
    "RandomBlock 1%": (ours(RandomBlock, ratio=0.01, seed=1), 0),
}
# A local row runs a method's compressor and optimizer on a process set of its own rank alone:
# every kernel and Horovod's cycle run, and nothing is sent. That is the floor plus the kernels,
# the step the method's exchange could at best reach. name -> the method it runs.
LOCAL_ROWS = {"DGC 0.1% local": "DGC 0.1% allgather", "Threshold 1% local": "Threshold 1%"}
DDP_ROWS = ("DDP dense", "DDP fp16", "DDP PowerSGD")
# A DDP + row runs a Horovod row's compressor (its settings, and its optimizer momentum) as DDP's
# communication hook, sparsecomm.torch.ddp_hook, over DDP's default group: the same method, the other
# way in. name -> that Horovod row. Each sends by allgather (RandomBlock: its shared allreduce); DGC's
# twin is its allgather row, the exchange auto keeps for it on this model.
DDP_HOOK_ROWS = {
    "DDP + DGC 0.1%": "DGC 0.1% allgather",
    "DDP + Threshold 1%": "Threshold 1%",
    "DDP + TopK 1%": "TopK 1%",
    "DDP + RandomBlock 1%": "RandomBlock 1%",
}
ROWS = (FLOOR, FLOOR_SYNCED, *METHODS, *LOCAL_ROWS, *DDP_ROWS, *DDP_HOOK_ROWS)  # in the order a run measures them
# Rows for hosts of several ranks (--ranks-per-host), asked for by name: not among the default rows.
HOST_ROWS = ("DGC 0.1% hierarchical",)
DEFAULT_ROWS = tuple(row for row in ROWS if row not in HOST_ROWS)
# `bench all`'s cells of hosts of several ranks: the flat exchanges, the hierarchical one, auto, and the peers.
HOST_CELL_ROWS = (
    FLOOR,
    "dense",
    "dense fp16",
    "DGC 0.1% allgather",
    "DGC 0.1% spardl",
    "DGC 0.1% hierarchical",
    "DGC 0.1% auto",
    "DDP PowerSGD",
)
BASELINES = (FLOOR, "dense")  # every ratio's reference: timed in every group of rows
POWERSGD_RANK = 4
POWERSGD_START = 2  # PowerSGD's first compressed iteration (it needs >= 2 with error feedback)


def model_and_batch(kind):
    torch.manual_seed(0)
    if kind in MLP_WIDTHS:
        outer, hidden = MLP_WIDTHS[kind]
        model = torch.nn.Sequential(
            torch.nn.Linear(outer, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, outer),
        )
        return model, torch.randn(8, outer), torch.randint(0, outer, (8,))
    conv = lambda i, o: [torch.nn.Conv2d(i, o, 3, padding=1), torch.nn.ReLU()]  # noqa: E731
    model = torch.nn.Sequential(
        *conv(3, 32),
        *conv(32, 64),
        torch.nn.MaxPool2d(2),
        *conv(64, 128),
        torch.nn.MaxPool2d(2),
        *conv(128, 128),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(128, 10),
    )
    return model, torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))


@dataclass
class Row:
    """One row, ready to step: what is stepped (the model, or its DDP wrapper), its optimizer and
    batch, its warm-up steps, `finish(times)`, which makes its record, `warmed()`, called after
    the warm-up (a compressor's byte counts start there), the first steps its record keeps
    (--first-steps, 0: none) and its warm-up steps' times (s), which time_rows fills in."""

    method: str
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    warmup: int
    finish: Callable
    warmed: Callable = lambda: None
    first_steps: int = 0
    warmup_times: list = field(default_factory=list)


def horovod_barrier():
    hvd.allreduce(torch.zeros(1), name="bench.barrier")


def timed_steps(row, steps, barrier=horovod_barrier):
    """(times (s) of `steps` steps of a row, each step's PHASES (s)). Every rank starts each step
    together: the barrier (Horovod's, or the caller's) is outside the timed region, for every row alike."""
    times, phases = [], []
    for _ in range(steps):
        barrier()
        started = time.perf_counter()
        row.opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(row.model(row.x), row.y)
        forward = time.perf_counter()
        loss.backward()
        backward = time.perf_counter()
        row.opt.step()
        ended = time.perf_counter()
        times.append(ended - started)
        phases.append((forward - started, backward - forward, ended - backward))
    return times, phases


def time_rows(makers, warmup, steps, rounds, group_size=0):
    """Yields (row, its step times, their PHASES, the step times of the baselines timed in the
    same turns or None) for the rows `makers` build (method -> make(warmup) -> Row), each with its
    warm-up steps' times in row.warmup_times. rounds 1: one row at a time, built, warmed up, timed
    for `steps`, dropped. rounds R > 1: the rows of a group (all of
    them, or `group_size` at once: groups()) alive together, each warmed up, then timed in R
    turns of about steps / R steps each, so that the machine's drift over the run falls on every
    row of the group alike. A baseline timed in several groups is yielded once, after its last
    group, with the steps of all of them."""
    plan = [[method] for method in makers] if rounds == 1 else groups(list(makers), group_size or len(makers))
    last_group = {method: i for i, group in enumerate(plan) for method in group}
    times = {method: [] for method in makers}
    phases = {method: [] for method in makers}
    for i, group in enumerate(plan):
        rows = [makers[method](warmup) for method in group]
        for row in rows:  # its warm-up steps' times kept: a new job's first steps (first_steps)
            row.warmup_times = timed_steps(row, row.warmup)[0]
            row.warmed()
        in_group = {row.method: [] for row in rows}
        for row, count in turns(rows, steps, rounds):
            before = nic_received()
            if before is not None:  # after every rank's last step: a host's NIC no longer carries it
                hvd.allreduce(torch.zeros(1), name="bench.nic.barrier")
                before = nic_received()
            row_times, row_phases = timed_steps(row, count)
            if before is not None:
                NIC_RECEIVED[row.method] = NIC_RECEIVED.get(row.method, 0) + nic_received() - before
            in_group[row.method] += row_times
            phases[row.method] += row_phases
        baselines = {m: t for m, t in in_group.items() if m in BASELINES} if rounds > 1 else {}
        for row in rows:
            times[row.method] += in_group[row.method]
            if last_group[row.method] == i:
                yield (
                    row,
                    times[row.method],
                    phases[row.method],
                    None if row.method in BASELINES else baselines or None,
                )
        del rows, row  # a group's models go before the next group's are built: collected now,
        gc.collect()  # as the optimizers' hooks hold them in reference cycles


NIC_RECEIVED = {}  # row -> bytes its host's NIC received during the row's timed steps (per-host model)


def nic_received():
    """Bytes the NIC of this rank's host has received so far: where the per-host network model
    names it (SPARSECOMM_NIC); None elsewhere. Inside a host, ranks talk over the loopback."""
    nic = os.environ.get("SPARSECOMM_NIC")
    if not nic:
        return None
    with open(f"/sys/class/net/{nic}/statistics/rx_bytes") as f:
        return int(f.read())


def groups(methods, size):
    """The rows alive at once: all `methods` where `size` holds them, else groups of `size` rows,
    each holding the baselines (floor and dense, where asked for), which every other row is then
    compared with turn by turn, and as many other rows as fit beside them."""
    if size >= len(methods):
        return [list(methods)]
    base = [m for m in methods if m in BASELINES]
    others = [m for m in methods if m not in BASELINES]
    room = size - len(base)
    if room < 1:
        raise ValueError(f"group_size: expected room for the baselines {base} and one more row, got {size}")
    return [base + others[i : i + room] for i in range(0, len(others), room)]


def turns(rows, steps, rounds):
    """(row, steps to time now) in the order of `rounds` turns over `rows`, `steps` per row in all.
    Every row times the same number of steps in a turn, so step i of every row falls in the same
    turn (steps pair up by index), and each turn starts one row further on, so that no row always
    runs right after the same one."""
    for turn in range(rounds):
        count = steps * (turn + 1) // rounds - steps * turn // rounds
        shift = turn % len(rows)
        for row in rows[shift:] + rows[:shift]:
            yield row, count


def ring_bytes(nbytes):
    """Bytes each rank sends (and receives) in a ring allreduce of `nbytes`: 2 (N-1)/N of them."""
    return 2 * (hvd.size() - 1) / hvd.size() * nbytes


def slowest_ms(times, name):
    """Each step's time on its slowest rank (ms): a step takes as long as that."""
    return (1000 * hvd.allreduce(torch.tensor(times, dtype=torch.float64), op=hvd.Max, name=name)).tolist()


def record(kind, method, family, model, times, sent, received, exchanges=()):
    """One row: step_times_ms holds each timed step's time on its slowest rank, step_ms their
    median."""
    step_times = slowest_ms(times, f"bench.{method}")
    numel = sum(p.numel() for p in model.parameters())
    nic = {}
    if nic_received() is not None:  # a host's NIC a step (every rank of the host counts it: averaged)
        per_step = torch.tensor(NIC_RECEIVED.get(method, 0) / len(times), dtype=torch.float64)
        nic["nic_received_bytes"] = hvd.allreduce(per_step, name=f"bench.nic.{method}").item()
    return nic | {
        "model": kind,
        "method": method,
        "family": family,
        "ranks": hvd.size(),
        "step_ms": statistics.median(step_times),
        "step_times_ms": step_times,
        "sent_bytes": sent,
        "received_bytes": received,
        "dense_bytes": numel * 4,
        "parameters": numel,
        "exchanges": list(exchanges),
    }


class Synced:
    """An optimizer whose step first waits for every rank (a 1-element allreduce)."""

    def __init__(self, opt):
        self.opt = opt

    def zero_grad(self):
        self.opt.zero_grad()

    def step(self):
        hvd.allreduce(torch.zeros(1), name="bench.floor.synced")
        self.opt.step()


def floor_row(kind, warmup, method=FLOOR):
    """No exchange at all: each rank steps on its own gradient, like dense minus the allreduce
    (FLOOR_SYNCED: after waiting for every rank)."""
    model, x, y = model_and_batch(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if method == FLOOR_SYNCED:
        opt = Synced(opt)
    return Row(method, model, opt, x, y, warmup, lambda times: record(kind, method, "floor", model, times, 0, 0))


ALONE = []  # init_horovod's process sets of one rank each, where local rows run


def init_horovod(methods):
    """hvd.init, with a process set of each rank alone where a local row is to run and the hosts'
    where a host row is (static process sets: every rank registers the same ones at init, once)."""
    sets = host_process_sets() if any(m in HOST_ROWS for m in methods) else []
    if any(m in LOCAL_ROWS for m in methods):
        hosts = {tuple(s.ranks): s for s in sets}  # hosts of one rank: the same sets
        ALONE[:] = [hosts.get((r,)) or hvd.ProcessSet([r]) for r in range(int(os.environ["HOROVOD_SIZE"]))]
    hvd.init(process_sets=sets + [s for s in ALONE if s not in sets] or None)


class Counted:
    """A compressor's stats() over the timed steps only: `warmed()` after the warm-up (auto's
    trial routes other ways at first; DGC's warm-up has other densities), then `timed()`."""

    KEYS = ("calls", "sent_bytes", "received_bytes", "compress_seconds")

    def __init__(self, compression, model):
        self.compression, self.parameters = compression, len(list(model.parameters()))
        self.warm = dict.fromkeys(self.KEYS, 0)

    def warmed(self):
        self.warm.update({key: self.compression.stats()[key] for key in self.KEYS})

    def timed(self, method):
        """(bytes sent and received a timed step, exchanges, its stats(), the wall ms in compress a
        timed step, averaged over the ranks: packs, routes, DGC's momentum; time preempted included)."""
        stats = self.compression.stats()
        timed = {key: stats[key] - self.warm[key] for key in self.KEYS}
        calls = max(1, timed["calls"] // self.parameters)
        exchanges = sorted({t.get("exchange", "") for t in stats["tensors"].values()} - {""})
        compress_ms = hvd.allreduce(
            torch.tensor(1000 * timed["compress_seconds"] / calls, dtype=torch.float64),
            name=f"bench.compress_ms.{method}",
        ).item()
        return timed["sent_bytes"] / calls, timed["received_bytes"] / calls, exchanges, stats, compress_ms


def route_trial(stats):
    """auto's route trial as a record holds it ({} where none ran)."""
    trial = next((t for t in stats["tensors"].values() if "route_trial_seconds" in t), None)
    if trial is None:
        return {}
    return {
        "route_trial": {
            "kept": trial["route_trial"],
            "step_ms": {side: 1000 * seconds for side, seconds in trial["route_trial_seconds"].items()},
            "ratios": trial["route_trial_ratios"],
            "steps": trial["route_trial_steps"],
            "predicted": trial.get("route_trial_predicted", {}),
        }
    }


def warmups(compression, warmup, first_steps):
    """(a row's warm-up steps, the first steps its record keeps) for its `compression`: auto's
    timed steps start with its routes final (SETTLING_STEPS); a compressor with an exchange keeps
    its `first_steps` first steps, all of them warm-up steps, so they are what a new job sees."""
    exchange = getattr(compression, "exchange", None)
    if exchange == "auto":
        warmup = max(warmup, SETTLING_STEPS)
    first = first_steps if exchange is not None else 0
    return max(warmup, first), first


def first_steps_fields(row, times):
    """A row's first row.first_steps step times (ms, each on its slowest rank; warm-up steps
    first, then timed ones) and their means (first_steps.means); {} where it keeps none."""
    if not row.first_steps:
        return {}
    first = slowest_ms((row.warmup_times + times)[: row.first_steps], f"bench.{row.method}.first")
    return {"first_steps_ms": first, "first_steps_mean_ms": means(first)}


def horovod_row(kind, method, warmup, first_steps=0):
    model, x, y = model_and_batch(kind)
    make, momentum = METHODS[LOCAL_ROWS.get(method, method)]
    process_set = ALONE[hvd.rank()] if method in LOCAL_ROWS else hvd.global_process_set
    compression = make(model, process_set)
    warmup, first = warmups(compression, warmup, first_steps)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=momentum),
        named_parameters=model.named_parameters(),
        compression=compression,
        process_set=process_set,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    counted = Counted(compression, model) if hasattr(compression, "stats") else None

    def finish(times):
        if counted is not None:
            sent, received, exchanges, stats, compress_ms = counted.timed(method)
            if method in LOCAL_ROWS:  # what it would send; nothing leaves the rank
                return dict(record(kind, method, "local", model, times, sent, received), local_of=LOCAL_ROWS[method])
            return dict(
                record(kind, method, "sparsecomm", model, times, sent, received, exchanges),
                compress_ms=compress_ms,
                **route_trial(stats),
            )
        # Horovod's ring allreduce of the (maybe fp16) gradient
        size = sum(p.numel() for p in model.parameters()) * (2 if method == "dense fp16" else 4)
        return record(kind, method, "horovod", model, times, ring_bytes(size), ring_bytes(size))

    return Row(method, model, opt, x, y, warmup, finish, counted.warmed if counted else lambda: None, first)


def init_torch_distributed():
    """torch.distributed (gloo) over the interface Horovod's Gloo uses: rank 0 opens a TCPStore
    on a free port (port 0: no race for it) of that interface's address and broadcasts it."""
    import socket

    import psutil

    iface = os.environ.get("HOROVOD_GLOO_IFACE", "lo")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)  # the hostname may not resolve inside a namespace
    store = None
    if hvd.rank() == 0:
        address = next(a.address for a in psutil.net_if_addrs()[iface] if a.family == socket.AF_INET)
        store = torch.distributed.TCPStore(address, 0, hvd.size(), is_master=True, wait_for_workers=False)
    address, port = hvd.broadcast_object((address, store.port) if store else None, 0, name="bench.store")
    if store is None:
        store = torch.distributed.TCPStore(address, port, hvd.size(), is_master=False)
    torch.distributed.init_process_group("gloo", store=store, rank=hvd.rank(), world_size=hvd.size())


def ddp_row(kind, method, warmup):
    """DistributedDataParallel with the hook of `method`; PowerSGD in ONE bucket (Gloo aborts on
    several) and warmed up past its vanilla-allreduce iterations, so every timed step compresses."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    model, x, y = model_and_batch(kind)
    numel = sum(p.numel() for p in model.parameters())
    one_bucket_mb = numel * 4 / 2**20 + 1
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, bucket_cap_mb=one_bucket_mb if method == "DDP PowerSGD" else None, gradient_as_bucket_view=True
    )
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    payload = numel * 4
    if method == "DDP fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        payload = numel * 2
    elif method == "DDP PowerSGD":
        state = powerSGD_hook.PowerSGDState(
            None, matrix_approximation_rank=POWERSGD_RANK, start_powerSGD_iter=POWERSGD_START
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        warmup = max(warmup, POWERSGD_START)

    def finish(times):
        sent = payload
        if method == "DDP PowerSGD":  # elements sent per step, counted by PowerSGD over its compressed steps
            sent = state.compression_stats()[2] / (warmup + len(times) - POWERSGD_START) * 4
        return record(kind, method, "ddp", model, times, ring_bytes(sent), ring_bytes(sent))

    return Row(method, ddp, opt, x, y, warmup, finish)


def ddp_hook_row(kind, method, warmup, first_steps=0):
    """DistributedDataParallel with the compressor of the Horovod row DDP_HOOK_ROWS names as its
    communication hook (no process_set: DDP's default group), with that row's optimizer momentum.
    Its bytes are the compressor's stats() over the timed steps, as the Horovod rows' are (the
    hook counts each gathered parameter at its padded capacity: what travels)."""
    import sparsecomm.torch as sct

    model, x, y = model_and_batch(kind)
    twin = DDP_HOOK_ROWS[method]
    make, momentum = METHODS[twin]
    compression = make(model, None)
    ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    ddp.register_comm_hook(compression, sct.ddp_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=momentum)
    warmup, first = warmups(compression, warmup, first_steps)
    counted = Counted(compression, model)

    def finish(times):
        sent, received, exchanges, stats, compress_ms = counted.timed(method)
        return dict(
            record(kind, method, "sparsecomm", model, times, sent, received, exchanges),
            compress_ms=compress_ms,
            way="ddp",
            horovod_twin=twin,
            **route_trial(stats),
        )

    return Row(method, ddp, opt, x, y, warmup, finish, counted.warmed, first)


def make_row(kind, method, first_steps=0):
    """method -> make(warmup) -> Row (a row of a compressor with an exchange keeps its
    `first_steps` first steps' times)."""
    if method in (FLOOR, FLOOR_SYNCED):
        return lambda warmup: floor_row(kind, warmup, method)
    if method in DDP_ROWS:
        return lambda warmup: ddp_row(kind, method, warmup)
    if method in DDP_HOOK_ROWS:
        return lambda warmup: ddp_hook_row(kind, method, warmup, first_steps)
    return lambda warmup: horovod_row(kind, method, warmup, first_steps)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--methods", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="1: one row at a time; R > 1: the rows of a group alive, timed in R interleaved turns",
    )
    parser.add_argument(
        "--group-size",
        type=int,
        default=0,
        help="with --rounds R > 1: rows alive at once, the baselines among them (0: every row)",
    )
    parser.add_argument(
        "--first-steps",
        type=int,
        default=0,
        help="N > 0: a row of a compressor with an exchange warms up at least N steps from a fresh "
        "compressor and records its first N step times and their means (0: none)",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    init_horovod(args.methods)
    torch.set_num_threads(1)
    if any(m in DDP_ROWS or m in DDP_HOOK_ROWS for m in args.methods):
        init_torch_distributed()
    records = []
    makers = {method: make_row(args.model, method, args.first_steps) for method in args.methods}
    for row, times, phases, baselines in time_rows(makers, args.warmup, args.steps, args.rounds, args.group_size):
        records.append(dict(row.finish(times), rounds=args.rounds, **first_steps_fields(row, times)))
        # each phase on its slowest rank, step by step: so a phase never exceeds its step's time, and
        # a step's phases add up to at least its time (the slowest rank of each may differ)
        records[-1]["phase_times_ms"] = {
            name: slowest_ms([p[j] for p in phases], f"bench.{row.method}.{name}") for j, name in enumerate(PHASES)
        }
        records[-1]["phases_ms"] = {name: statistics.median(t) for name, t in records[-1]["phase_times_ms"].items()}
        if baselines:  # what this row is compared with: the baselines' steps in its own turns
            records[-1]["baselines"] = {m: slowest_ms(t, f"bench.{row.method}.{m}") for m, t in baselines.items()}
        if hvd.rank() == 0:
            print(
                f"[e2e] {args.model} np{hvd.size()} {row.method:<20} {records[-1]['step_ms']:9.1f} ms/step", flush=True
            )
        del row  # not kept alive while the next group is built
    records.sort(key=lambda r: args.methods.index(r["method"]))  # baselines finish after their last group
    if torch.distributed.is_initialized():
        destroy_process_group()
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
