"""Worker of the compressed HSDP benchmark (run by benchmarks.hsdp, one process per rank in its
host's network namespace, or under horovodrun): the step time of each row of benchmarks.hsdp on
FSDP2 over a (replicate, shard) mesh of hosts of --ranks-per-host ranks; medians over the timed
steps of the slowest rank, after warm-up steps. With --rounds R every row is built first and the
rows are timed in R interleaved turns (benchmarks.e2e_worker.turns), so drift falls on all alike.

Horovod only starts the job: its rendezvous hands torch.distributed (Gloo) its store, then it is
shut down, so that its background cycle sends nothing over the hosts' NICs while they are counted
(the per-host model's SPARSECOMM_NIC: what the host's NIC sent and received during each row's
timed steps). The model and batch are the e2e bench's (model_and_batch), alike on every rank."""

import argparse
import functools
import gc
import os
import statistics

import horovod.torch as hvd
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

import sparsecomm.torch as sct
from benchmarks.e2e import MODELS, PHASES
from benchmarks.e2e_worker import Row, init_torch_distributed, model_and_batch, timed_steps, turns
from benchmarks.hsdp import FLOOR, HOOKED, NATIVE, ROWS
from benchmarks.hsdp_mesh import replica_mesh, save_records, shard_layers


def sharded(kind, mesh):
    """The e2e bench's `kind` model, each layer with parameters and the root sharded over `mesh`."""
    model, x, y = model_and_batch(kind)
    return shard_layers(model, mesh), x, y


def shard_bytes(model):
    """Bytes of this rank's shards of the model's parameters (float32): what it all-reduces."""
    return sum(p.to_local().numel() * p.element_size() for p in model.parameters())


def make_row(kind, method, mesh, warmup):
    """A row of `method`, ready to step: its model sharded, its hook (the floor's divides only),
    its optimizer; its record's bytes from the compressor's stats() over the timed steps."""
    replicas = mesh["replicate"].size()
    model, x, y = sharded(kind, mesh if method == NATIVE else mesh["shard"])
    momentum, compression, warm = 0.9, None, {}
    if method in HOOKED:
        name, settings, momentum = HOOKED[method]
        compression = getattr(sct, name)(named_parameters=model.named_parameters(), **settings)
        sct.register_fsdp_hook(model, compression, mesh["replicate"])
    elif method == FLOOR:  # what FSDP leaves to the replicas' all-reduce: the mean's division alone
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_all_reduce_hook(functools.partial(torch.Tensor.div_, other=replicas))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=momentum)

    def warmed():
        if compression is not None:
            warm.update(compression.stats())

    def sent(timed_steps):
        """Bytes this rank sends across the replicas a timed step."""
        if compression is not None:
            return (compression.stats()["sent_bytes"] - warm["sent_bytes"]) / timed_steps
        if method == NATIVE:  # the ring's share: 2 (N - 1) / N of the shards
            return 2 * (replicas - 1) / replicas * shard_bytes(model)
        return 0.0

    return Row(method, model, opt, x, y, warmup, sent, warmed)


def nic_bytes():
    """(sent, received) bytes of this rank's host's NIC so far where the per-host model names it
    (SPARSECOMM_NIC), else None."""
    nic = os.environ.get("SPARSECOMM_NIC")
    if not nic:
        return None
    counts = []
    for way in ("tx", "rx"):
        with open(f"/sys/class/net/{nic}/statistics/{way}_bytes") as f:
            counts.append(int(f.read()))
    return counts


def time_rows(makers, warmup, steps, rounds):
    """Yields (row, step times, their phases, NIC bytes (sent, received) over them or None) for the
    rows `makers` build: rounds 1, one at a time; R > 1, all alive, timed in R interleaved turns."""
    plan = [[method] for method in makers] if rounds == 1 else [list(makers)]
    for group in plan:
        rows = [makers[method](warmup) for method in group]
        for row in rows:
            timed_steps(row, row.warmup, barrier=dist.barrier)
            row.warmed()
        times = {row.method: [] for row in rows}
        phases = {row.method: [] for row in rows}
        nic = {row.method: [0, 0] for row in rows}
        for row, count in turns(rows, steps, rounds):
            dist.barrier()
            before = nic_bytes()
            row_times, row_phases = timed_steps(row, count, barrier=dist.barrier)
            if before is not None:
                nic[row.method] = [n + after - b for n, after, b in zip(nic[row.method], nic_bytes(), before)]
            times[row.method] += row_times
            phases[row.method] += row_phases
        for row in rows:
            yield row, times[row.method], phases[row.method], nic[row.method] if nic_bytes() is not None else None
        del rows, row
        gc.collect()


def slowest_ms(times):
    """Each step's time on its slowest rank (ms)."""
    tensor = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return (1000 * tensor).tolist()


def mean_over_ranks(value):
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.item() / dist.get_world_size()


def record(kind, row, times, phases, nic, per_host, rounds):
    """One row's record: step_times_ms each timed step on its slowest rank, step_ms their median;
    host_sent_bytes what a host's ranks send across the replicas a step; nic_sent_bytes and
    nic_received_bytes what a host's NIC did a step (each rank reads its host's: the mean)."""
    step_times = slowest_ms(times)
    phase_times = {name: slowest_ms([p[j] for p in phases]) for j, name in enumerate(PHASES)}
    numel = sum(p.numel() for p in row.model.parameters())
    measured = {}
    if nic is not None:
        measured = {f"nic_{way}_bytes": mean_over_ranks(n / len(times)) for way, n in zip(("sent", "received"), nic)}
    return measured | {
        "model": kind,
        "method": row.method,
        "ranks": dist.get_world_size(),
        "rounds": rounds,
        "step_ms": statistics.median(step_times),
        "step_times_ms": step_times,
        "phases_ms": {name: statistics.median(t) for name, t in phase_times.items()},
        "host_sent_bytes": per_host * mean_over_ranks(row.finish(len(times))),
        "dense_bytes": numel * 4,
        "parameters": numel,
    }


def init():
    """torch.distributed over Horovod's rendezvous (Gloo, the NIC Horovod was given); Horovod then
    shut down."""
    hvd.init()
    init_torch_distributed()
    hvd.shutdown()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--ranks-per-host", type=int, required=True)
    parser.add_argument("--methods", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    init()
    torch.set_num_threads(1)
    per_host = args.ranks_per_host
    mesh = replica_mesh(per_host)
    makers = {method: functools.partial(make_row, args.model, method, mesh) for method in args.methods}
    records = []
    for row, times, phases, nic in time_rows(makers, args.warmup, args.steps, args.rounds):
        records.append(record(args.model, row, times, phases, nic, per_host, args.rounds))
        if dist.get_rank() == 0:
            print(f"[hsdp] {args.model} {row.method:<23} {records[-1]['step_ms']:9.1f} ms/step", flush=True)
        del row
    records.sort(key=lambda r: args.methods.index(r["method"]))
    save_records(records, args.out, sct.destroy_process_group)


if __name__ == "__main__":
    main()
