"""Worker of scripts/device/run.sh: stock hvd.DistributedOptimizer with sparsecomm's compressors
on cuda tensors (cpu tensors in a rehearsal), under horovodrun.

    horovodrun -np 1 python scripts/device/hvd_cuda.py --device cuda             (NCCL)
    horovodrun -np 2 --gloo python scripts/device/hvd_cuda.py --device cuda      (both on GPU 0)

A tiny MLP is trained for --steps SGD steps once per configuration (DGC and TopK, each over
allgather and SparDL: sparsecomm.check.worker's), the optimizer built as a user would build it:

    hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                             compression=sparsecomm.torch.DGC(named_parameters=..., ratio=0.1, ...))

Each configuration passes when the model and its gradients stayed on --device, the loss on a
fixed evaluation set fell, every rank ended with bitwise identical parameters, and fewer bytes
went out than a dense allreduce sends. Rank 0 prints a line per configuration, a JSON record
each ("[hvd_cuda] record {...}"), and exits 1 when one failed."""

import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # this checkout's sparsecomm, wherever the script is started from

from sparsecomm.check.worker import CONFIGS, Horovod, dataset, train  # noqa: E402


def horovod_build(hvd):
    """What this Horovod was built with: its GPU operations decide where cuda tensors go."""
    return {
        "nccl": hvd.nccl_built(),  # NCCL's version code, 0 without
        "cuda": hvd.cuda_built(),
        "gloo": hvd.gloo_enabled(),
        "mpi": hvd.mpi_enabled(),
    }


def verdict(record, device):
    """The reasons a configuration failed ([] when it passed)."""
    failed = []
    if not record["device"].startswith(device):
        failed.append(f"trained on {record['device']}, not {device}")
    if not record["loss_after"] < record["loss_before"]:
        failed.append(f"loss did not fall ({record['loss_before']:.4f} -> {record['loss_after']:.4f})")
    if not record["ranks_equal"]:
        failed.append(f"ranks differ (max {record['max_rank_difference']:.3g})")
    if not record["sent_bytes"] < record["dense_bytes"]:
        failed.append(f"sent {record['sent_bytes']} bytes, dense {record['dense_bytes']}")
    return failed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    way = Horovod()  # hvd.init()
    hvd = way.hvd
    device = torch.device("cpu")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("[hvd_cuda] --device cuda, but torch sees no GPU")
        device = torch.device("cuda", way.local_rank % torch.cuda.device_count())  # 2 ranks share 1 GPU
        torch.cuda.set_device(device)
    build = horovod_build(hvd)
    if way.rank == 0:
        import horovod

        print(
            f"[hvd_cuda] {way.size} rank(s) on {device}; horovod {horovod.__version__} built with {build}", flush=True
        )
    x, y = dataset(device)
    failures = 0
    for name in args.configs:
        started = time.perf_counter()
        record = train(way, CONFIGS, name, args.steps, args.lr, x, y)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        record.update(seconds=time.perf_counter() - started, horovod=build)
        failed = verdict(record, args.device)
        failures += bool(failed)
        if way.rank == 0:
            print(
                f"[hvd_cuda] {'PASS' if not failed else 'FAIL'} {name}: loss {record['loss_before']:.4f} -> "
                f"{record['loss_after']:.4f}, ranks bitwise equal: {record['ranks_equal']}, sent "
                f"{record['sent_bytes'] / record['dense_bytes']:.0%} of dense, {record['seconds']:.1f} s"
                + (f" ({'; '.join(failed)})" if failed else ""),
                flush=True,
            )
            print("[hvd_cuda] record " + json.dumps(record), flush=True)
    way.close()
    if way.rank == 0:
        print(f"[hvd_cuda] {len(args.configs) - failures} of {len(args.configs)} configurations passed", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
