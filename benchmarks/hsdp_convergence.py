"""Compressed HSDP's convergence (`python -m benchmarks hsdp-convergence`): the digits task of the
convergence benchmark (benchmarks.convergence_worker: its data, CNN, epochs, learning-rate warm-up
and test accuracy) trained by FSDP2 on 2 replicas of 2 ranks (torchrun, Gloo, unshaped loopback:
accuracy does not depend on the network), each rank a 16-image batch of its own shard a step:

  native HSDP            fully_shard over the 2-D mesh: FSDP all-reduces the shards across the
                         replicas itself, dense (SGD momentum 0.9, as the dense Horovod row)
  HSDP + DGC 0.1%, ...   fully_shard over the replica's ranks and sparsecomm.torch.register_fsdp_hook
                         with the compressor across the replicas: the settings and optimizer momentum
                         of the Horovod convergence row of the same method (convergence_worker.methods)

Each method trains once per seed (the initial weights, alike on every rank, and the data order);
the table gives each seed's final accuracy, their mean and the change against native HSDP's mean."""

import json
import os
import sys
import tempfile

from . import network
from .convergence import SEEDS, merged

NATIVE = "native HSDP"
# row -> the Horovod convergence row whose compressor and optimizer momentum it takes
HOOKED = {
    "HSDP + DGC 0.1%": "DGC 0.1%",
    "HSDP + Threshold 1%": "Threshold 1%",
    "HSDP + RandomBlock 1%": "RandomBlock 1%",
}
ROWS = (NATIVE, *HOOKED)


def add_options(p):
    """`bench hsdp-convergence`'s options."""
    p.add_argument("--hosts", type=int, default=2, help="replicas (default 2)")
    p.add_argument("--ranks-per-host", type=int, default=2, help="ranks a replica, sharding its model (default 2)")
    p.add_argument("--hsdp-methods", dest="methods", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--epochs", type=int, help="default: the digits task's (30)")
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="default: 0 1")
    p.add_argument("--json", help="write the records here")


def torchrun(ranks, module, args, marker, log=print):
    """Runs `python -m module args` on `ranks` local processes under torchrun; forwards the lines
    holding `marker` to `log`; raises with the tail of the output on failure."""
    import subprocess

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    cmd += ["-m", module, *args]
    proc = subprocess.Popen(cmd, env=network._env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        tail = network._follow([proc], proc.stdout, marker, log)
    finally:
        if proc.poll() is None:  # interrupted: torchrun ends its ranks on SIGTERM
            proc.terminate()
            proc.wait(timeout=30)
    if proc.wait() != 0:
        raise RuntimeError(f"torchrun failed ({module} {' '.join(args[:4])} ...):\n{''.join(tail)}")


def run(args, log=print):
    """`bench hsdp-convergence`: every method once per seed, then the table. Returns the records
    (one per method, merged over the seeds as benchmarks.convergence merges them)."""
    ranks = args.hosts * args.ranks_per_host
    trained = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            out = os.path.join(tmp, f"records-{seed}.json")
            worker = ["--ranks-per-host", str(args.ranks_per_host), "--seed", str(seed), "--out", out]
            worker += ["--methods", *args.methods] + (["--epochs", str(args.epochs)] if args.epochs else [])
            log(f"\n== digits, {args.hosts} replicas of {args.ranks_per_host} ranks, seed {seed}")
            torchrun(ranks, "benchmarks.hsdp_convergence_worker", worker, "[hsdp-convergence]", log)
            with open(out) as f:
                trained += json.load(f)
    records = merged(trained)
    for record in records:  # the largest over the seeds (merged keeps the first seed's)
        record["replica_spread"] = max(r["replica_spread"] for r in trained if r["method"] == record["method"])
    log("\n" + table(records))
    return records


def table(records):
    """A text table: each method's final accuracy per seed, their mean and the change against native
    HSDP's mean (points); spread: the largest gap between two ranks' accuracies (0: replicas agree)."""
    native = next((r for r in records if r["method"] == NATIVE), None)
    seeds = records[0].get("seeds") or [records[0]["seed"]]
    header = f"{'method':<24}" + "".join(f"{f'seed {s}':>9}" for s in seeds)
    header += f"{'mean':>9}{'vs native':>12}{'spread':>9}"
    lines = [header, "-" * len(header)]
    for r in records:
        finals = r.get("finals") or [r["final"]]
        change = "-" if native is None or r is native else f"{100 * (r['final'] - native['final']):+.1f} pt"
        line = f"{r['method']:<24}" + "".join(f"{100 * v:>8.1f}%" for v in finals)
        lines.append(line + f"{100 * r['final']:>8.1f}%{change:>12}{100 * r['replica_spread']:>8.1f}%")
    return "\n".join(lines)
