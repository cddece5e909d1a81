"""python -m sparsecomm.check.hook_step [--device cpu|cuda] [--steps N] [--layout resnet50|small]
[--json PATH]: what the DDP hook costs a step, and what each more tensor costs.

One rank (a process group of one: no network), ResNet-50's 161 parameter shapes and the same
25,557,032 elements as 16 equal tensors, a linear loss (each gradient is a fixed random tensor:
the step is the backward's copies, DDP and the hook). `--layout small`: 161 matrices of 64x64
against 16 of the same elements, where what a tensor costs is the hook's own, not its kernels'
passes over memory (matrices: the default policy sends 1-D tensors dense). Each hook's step is
set against DDP's own allreduce step on the same tensors, measured in the same run, and the
hook's cost per tensor is its extra time over DDP's at 161 tensors less that at 16, over the
145 more tensors."""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from . import kernels

# name -> the compressor's class name and settings (None: DDP's own allreduce)
METHODS = {
    "DDP allreduce": None,
    "DGC 0.1%": ("DGC", dict(ratio=0.001, momentum=0.9, exchange="allgather")),
    "Threshold 1%": ("Threshold", dict(ratio=0.01, exchange="allgather")),
    "TopK 1%": ("TopK", dict(ratio=0.01, exchange="allgather")),
    "DGC 0.1% spardl": ("DGC", dict(ratio=0.001, momentum=0.9, exchange="spardl")),
    "RandomBlock 1%": ("RandomBlock", dict(ratio=0.01)),
}
WARMUP = 3


def layouts(layout="resnet50"):
    """{name: shapes}: 161 tensors (ResNet-50's shapes, or `small` ones), and the same elements
    in 16 tensors."""
    if layout == "small":
        return {"161 tensors": [(64, 64)] * 161, "16 tensors": [(16, 161 * 4096 // 256)] * 16}
    shapes = kernels.resnet50_shapes()
    total = sum(torch.Size(s).numel() for s in shapes)
    return {"161 tensors": shapes, "16 tensors": [(total // 16,)] * 15 + [(total - 15 * (total // 16),)]}


class LinearLoss(torch.nn.Module):
    """Parameters of the given shapes; loss = sum(p * c) with c fixed: each gradient is its c."""

    def __init__(self, shapes, device):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(s, generator=generator).to(device)) for s in shapes
        )
        self.factors = [torch.randn(s, generator=generator).to(device) for s in shapes]

    def forward(self):
        return sum((p * c).sum() for p, c in zip(self.weights, self.factors))


def ddp_step(shapes, method, device):
    """A function that runs one step of DDP over `shapes` with `method`'s hook (None: DDP's
    allreduce) and returns its seconds."""
    import sparsecomm.torch as sct

    model = LinearLoss(shapes, device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    if method is not None:
        cls, settings = method
        compression = getattr(sct, cls)(named_parameters=model.named_parameters(), **settings)
        ddp.register_comm_hook(compression, sct.ddp_hook)

    def step():
        started = time.perf_counter()
        ddp().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        model.zero_grad(set_to_none=False)
        return time.perf_counter() - started

    return step


def measure(device, steps, layout="resnet50"):
    """A record per method and layout: step_ms (the median; the methods' steps interleaved, so
    that the machine's drift falls on all alike), vs_allreduce, extra_ms (the median of each
    round's step less DDP's allreduce step of the same round); per method, us_per_tensor."""
    records = []
    for name, shapes in layouts(layout).items():
        runs = {method: ddp_step(shapes, spec, device) for method, spec in METHODS.items()}
        times = {method: [] for method in METHODS}
        for round_ in range(WARMUP + steps):
            for method, step in runs.items():
                seconds = step()
                if round_ >= WARMUP:
                    times[method].append(seconds)
        del runs
        base = times["DDP allreduce"]
        for method, seconds in times.items():
            ms = statistics.median(seconds) * 1e3
            extra = statistics.median(s - b for s, b in zip(seconds, base)) * 1e3
            ratio = ms / (statistics.median(base) * 1e3)
            records.append(
                dict(method=method, layout=name, tensors=len(shapes), step_ms=ms, vs_allreduce=ratio, extra_ms=extra)
            )
    by = {(r["method"], r["tensors"]): r for r in records}
    for r in records:
        r["us_per_tensor"] = (by[(r["method"], 161)]["extra_ms"] - by[(r["method"], 16)]["extra_ms"]) / 145 * 1e3
    return records


def table(records):
    lines = [
        "| hook | 16 tensors | x allreduce | 161 tensors | x allreduce | hook's cost per tensor |",
        "|---|---|---|---|---|---|",
    ]
    by = {(r["method"], r["tensors"]): r for r in records}
    for method in METHODS:
        few, many = by[(method, 16)], by[(method, 161)]
        per_tensor = "" if method == "DDP allreduce" else f"{many['us_per_tensor']:.0f} us"
        lines.append(
            f"| {method} | {few['step_ms']:.2f} ms | {few['vs_allreduce']:.2f} | {many['step_ms']:.2f} ms | "
            f"{many['vs_allreduce']:.2f} | {per_tensor} |"
        )
    return "\n".join(lines)


def _group(device):
    """A process group of this one rank (Gloo on cpu, NCCL on cuda), unless one exists."""
    if dist.is_initialized():
        return
    from .steps import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sparsecomm.check.hook_step", description=__doc__)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--steps", type=int, default=10, help="timed steps per row, after 3 warm-up steps")
    parser.add_argument("--layout", default="resnet50", choices=("resnet50", "small"), help="the tensors' shapes")
    parser.add_argument("--json", metavar="PATH", help="also write the records here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    _group(device)
    records = measure(device, args.steps, args.layout)
    print(table(records), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": args.device, "steps": args.steps, "layout": args.layout, "records": records}, f, indent=1
            )
    import sparsecomm.torch as sct

    sct.destroy_process_group()


if __name__ == "__main__":
    main()
