"""Worker of the compressed HSDP convergence benchmark (run by benchmarks.hsdp_convergence under
torchrun, Gloo): the digits task of benchmarks.convergence_worker (its Digits shard of each rank,
CNN, epochs, learning-rate warm-up and test accuracy) on FSDP2 over a (replicate, shard) mesh of
replicas of --ranks-per-host ranks, each row of benchmarks.hsdp_convergence for one --seed.

FSDP does not broadcast the initial weights: every rank builds the model from the same seed
(digits_model(seed)), so the replicas start alike (register_fsdp_hook checks it). The digits task
clips nothing (its clip_norm is None), so each step is a plain optimizer step."""

import argparse

import torch
import torch.distributed as dist

import sparsecomm.torch as sct
from benchmarks.convergence_worker import TASKS, Digits, methods, run_epochs, warmed_up, warmup_epochs
from benchmarks.hsdp_convergence import HOOKED, NATIVE, ROWS
from benchmarks.hsdp_mesh import replica_mesh, save_records, shard_layers

TASK = "digits"


def spread(value):
    """The largest gap between two ranks' `value` (0 where the replicas agree)."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return max(everyone) - min(everyone)


def train(method, mesh, seed):
    """One row's record: the test accuracy after each epoch (rank 0's), the final one, and the
    spread of the final accuracy over the ranks."""
    settings = TASKS[TASK]
    assert settings["clip_norm"] is None, "the digits task clips nothing: no clipping here"
    work = Digits(settings["batch"], dist.get_rank(), dist.get_world_size(), seed)  # same weights on every rank
    model = shard_layers(work.model, mesh if method == NATIVE else mesh["shard"])
    make, momentum = methods(TASK, work.steps_per_epoch)[HOOKED.get(method, "dense")]
    compression = None
    if method in HOOKED:
        compression = make(model)
        sct.register_fsdp_hook(model, compression, mesh["replicate"])
    opt = torch.optim.SGD(model.parameters(), lr=settings["lr"], momentum=momentum)
    schedule = warmed_up(opt, round(warmup_epochs(TASK) * work.steps_per_epoch))
    curve = run_epochs(model, work, opt, schedule, settings["epochs"], opt.step)
    return {
        "task": TASK,
        "method": method,
        "ranks": dist.get_world_size(),
        "replicas": mesh["replicate"].size(),
        "seed": seed,
        "metric": work.metric,
        "curve": curve,
        "final": curve[-1],
        "replica_spread": spread(curve[-1]),
        "stats": compression.stats() if compression is not None else None,
        "epochs": settings["epochs"],
        "data": work.data,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks-per-host", type=int, required=True)
    parser.add_argument("--methods", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--seed", type=int, default=0, help="the model's initial weights and the data order")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, mesh = dist.get_rank(), replica_mesh(args.ranks_per_host)
    if args.epochs:
        TASKS[TASK]["epochs"] = args.epochs
    records = []
    for method in args.methods:
        records.append(train(method, mesh, args.seed))
        if rank == 0:
            r = records[-1]
            print(f"[hsdp-convergence] {method:<23} seed {args.seed} final accuracy {r['final']:.4f}", flush=True)
    save_records(records, args.out, sct.destroy_process_group)


if __name__ == "__main__":
    main()
