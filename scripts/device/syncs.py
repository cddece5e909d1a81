"""python scripts/device/syncs.py [--device cuda|cpu] [--steps N]: does the DDP hook make the host
wait for the GPU? One rank (NCCL on cuda), ResNet-50's first 40 parameter shapes, a linear loss;
each step after the first (which checks the settings) runs its backward, the hook and its
collectives' callbacks included, under torch.cuda.set_sync_debug_mode("error"), so that any host
synchronisation raises. DDP's own allreduce is the control. Prints a line a method and exits 1
if one synchronised. On cpu (a rehearsal) the steps run and nothing is counted."""

import argparse
import os
import sys

import torch
import torch.distributed as dist

import sparsecomm.torch as sct
from sparsecomm.check import kernels
from sparsecomm.check.hook_step import LinearLoss
from sparsecomm.check.steps import free_port

METHODS = {  # name -> (class, settings); None: DDP's own allreduce
    "DDP allreduce": None,
    "Threshold 1%": ("Threshold", dict(ratio=0.01, exchange="allgather")),
    "Threshold 1%, 2-bit": ("Threshold", dict(ratio=0.01, quantize="2bit", exchange="allgather")),
    "DGC 0.1%": ("DGC", dict(ratio=0.001, momentum=0.9, exchange="allgather")),
    "DGC 0.1%, clip_norm": ("DGC", dict(ratio=0.001, momentum=0.9, clip_norm=1.0, exchange="allgather")),
    "TopK 1%": ("TopK", dict(ratio=0.01, exchange="allgather")),
    "RTopK 1% of 2%": ("RTopK", dict(ratio=0.01, r=0.02, exchange="allgather")),
    "DGC 0.1%, spardl": ("DGC", dict(ratio=0.001, momentum=0.9, exchange="spardl")),
    "TopK 1%, spardl": ("TopK", dict(ratio=0.01, exchange="spardl")),
}


def synchronisations(method, device, steps):
    """None if `steps` steps after the first made no host synchronisation, else the error."""
    model = LinearLoss(kernels.resnet50_shapes()[:40], device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    if method is not None:
        cls, settings = method
        ddp.register_comm_hook(getattr(sct, cls)(named_parameters=model.named_parameters(), **settings), sct.ddp_hook)
    for step in range(1 + steps):
        loss = ddp()
        watched = step > 0 and device.type == "cuda"
        try:
            if watched:
                torch.cuda.set_sync_debug_mode("error")
            loss.backward()
        except RuntimeError as error:
            return str(error).splitlines()[0][:200]
        finally:
            if watched:
                torch.cuda.set_sync_debug_mode("default")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        model.zero_grad(set_to_none=False)
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    failed = 0
    for name, method in METHODS.items():
        error = synchronisations(method, device, args.steps)
        failed += error is not None
        counted = "not counted (cpu)" if device.type != "cuda" else "none" if error is None else f"FAIL: {error}"
        print(f"[syncs] {name}: {args.steps} steps, host synchronisations: {counted}", flush=True)
    sct.destroy_process_group()
    if device.type == "cuda":
        print(f"[syncs] {len(METHODS) - failed} of {len(METHODS)} methods made no synchronisation", flush=True)
    else:
        print(f"[syncs] {len(METHODS)} of {len(METHODS)} methods ran (cpu: nothing counted)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
