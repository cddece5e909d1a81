"""Kernel benchmark (run by `make check`, and by the repository's `make bench`): every
sparsecomm kernel on realistic sizes, with the baselines measured in the same run (memcpy of
the same float32 buffer and torch.topk(x.abs(), k)), so the ratios carry to other machines;
and the whole path of TopK, Threshold and DGC (at densities up to 0.1%) on one rank, compress
-> Horovod allreduce -> decompress, against the same memcpy: on one tensor of each size (the
TensorFlow compressors' too, on the CPU: tf_paths.py), and on a model's many (`MODELS`:
ResNet-50's 161 gradients, the same 25.6M elements in tensors of 64 to 2.4M, where what a
tensor costs besides its elements shows), beside Horovod with no compression and a torch.topk
per tensor on the same tensors. Medians of repeated runs after a warm-up. Each op's memcpy is
timed in turn with the op itself, call for call, so a machine whose speed drifts (a shared
host) moves both alike.

    python -m sparsecomm.check.kernels [--device cuda] [--sizes N ...] [--json PATH]"""

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

from ..core.selection import selected_count
from ..torch import ops

SIZES = (1_000_000, 25_557_032)  # 25,557,032 = one ResNet-50 gradient
DENSITIES = (0.001, 0.01)
# The whole-path rows run Horovod's cycle; the kernels alone need only torch (a GPU machine's
# stock image has no Horovod).
WITH_HOROVOD = importlib.util.find_spec("horovod") is not None


def resnet50_shapes():
    """ResNet-50's 161 parameter shapes, in parameter order (the stem; per bottleneck block
    the 1x1, 3x3 and 1x1 convolutions, each followed by its batch norm's weight and bias, and
    the first block of each stage a 1x1 downsampling convolution and norm; the classifier):
    25,557,032 elements."""
    shapes, inputs = [(64, 3, 7, 7), (64,), (64,)], 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        outputs = 4 * width
        for block in range(blocks):
            shapes += [
                (width, inputs, 1, 1),
                (width,),
                (width,),
                (width, width, 3, 3),
                (width,),
                (width,),
                (outputs, width, 1, 1),
                (outputs,),
                (outputs,),
            ]
            if block == 0:
                shapes += [(outputs, inputs, 1, 1), (outputs,), (outputs,)]
            inputs = outputs
    return shapes + [(1000, 2048), (1000,)]


MODELS = {"resnet50": ("ResNet-50's 161 tensors", resnet50_shapes)}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_ms(fn, device, setup=None):
    args = setup() if setup else ()
    _sync(device)
    started = time.perf_counter()
    fn(*args)
    _sync(device)
    return 1000 * (time.perf_counter() - started)


def median_ms(fn, device, repeats, setup=None):
    """Median wall time of fn() in ms; setup() runs untimed before each call."""
    _timed_ms(fn, device, setup)  # warm-up
    return statistics.median(_timed_ms(fn, device, setup) for _ in range(repeats))


def paired_median_ms(fn, baseline, device, repeats, setup=None):
    """Medians of fn() and of baseline(), timed alternately: (fn's, baseline's) in ms."""
    _timed_ms(fn, device, setup)
    _timed_ms(baseline, device)
    times = [(_timed_ms(fn, device, setup), _timed_ms(baseline, device)) for _ in range(repeats)]
    return statistics.median(t for t, _ in times), statistics.median(b for _, b in times)


def cases(x, density):
    """(name, fn, setup) for each kernel at this size and density."""
    numel = x.numel()
    k = selected_count(density, numel)
    residual0 = torch.randn(numel, device=x.device) * 0.01
    threshold = ops.sample_threshold(x, residual0, density)

    def fresh_residual():
        return (residual0.clone(),)

    values, index = ops.pack_topk(x, None, k)
    dense = torch.empty_like(x)
    rows = ops.wire_rows(values, index, 0, numel)
    rows_copy = torch.empty_like(rows)
    return [
        ("sample_threshold", lambda r: ops.sample_threshold(x, r, density), fresh_residual),
        ("pack_above (fused EF threshold pack)", lambda r: ops.pack_above(x, r, threshold), fresh_residual),
        ("pack_sampled (estimate + pack + band)", lambda r: ops.pack_sampled(x, r, density), fresh_residual),
        ("pack_topk (exact top-k, EF)", lambda r: ops.pack_topk(x, r, k), fresh_residual),
        ("topk (exact, no EF)", lambda: ops.pack_topk(x, None, k), None),
        ("block_pack (random block, EF)", lambda r: ops.block_pack(x, r, 12345 % numel, k), fresh_residual),
        ("sparse_unpack (k values, into a buffer)", lambda: ops.sparse_unpack(values, index, numel, out=dense), None),
        (
            "block_unpack (k values, into a buffer)",
            lambda: ops.block_unpack(values, numel, 12345 % numel, out=dense),
            None,
        ),
        ("wire_rows (k values + indices to wire rows)", lambda: ops.wire_rows(values, index, 0, numel), None),
        ("wire_columns (wire rows to k values + indices)", lambda: ops.wire_columns(rows, x.dtype), None),
        ("copy of the wire rows' bytes (the two above's floor)", lambda: rows_copy.copy_(rows), None),
    ]


def _path_cases(x, density):
    """(name, fn, setup) of a compressor's whole path on one rank, as hvd.DistributedOptimizer
    runs it: compress -> Horovod allreduce (of what compress hands over) -> decompress. The
    gradient buffer is refilled before each call (untimed): decompress writes its result there."""
    import horovod.torch as hvd

    hvd.init()
    param = torch.nn.Parameter(torch.empty_like(x))
    grad = torch.empty_like(x)
    makers = _compressor_classes()
    cases = []
    for name in path_methods(density):
        make = makers[name]
        compressor = make(
            ratio=density, exchange="allgather", named_parameters=[("w", param)], min_numel=0, dense_1d=False
        )

        def path(compressor=compressor):
            handed, ctx = compressor.compress(param.grad)
            compressor.decompress(hvd.allreduce_(handed, name="bench.path"), ctx)

        def refill():
            param.grad = grad.copy_(x)
            return ()

        cases.append((f"{name} whole path (1 rank)", path, refill))
    return cases


def _tf_paths(device):
    """Whether the TF compressors' whole path is timed: on the CPU, where TensorFlow is installed
    (the TF GPU kernels have not run on a GPU yet)."""
    return torch.device(device).type == "cpu" and importlib.util.find_spec("tensorflow") is not None and WITH_HOROVOD


def _tf_path_timings(numel, density, dtype, repeats):
    """(name, median ms, its memcpy's median ms) of each TF compressor's whole path at this size
    and density, timed by sparsecomm.check.tf_paths in a process of its own: horovod.tensorflow
    and horovod.torch both initialised in one process without horovodrun (MPI) crash there, as
    their two libraries share the controller's symbols."""
    command = [
        sys.executable,
        "-m",
        "sparsecomm.check.tf_paths",
        "--numel",
        str(numel),
        "--density",
        str(density),
        "--dtype",
        str(dtype).replace("torch.", ""),
        "--repeats",
        str(repeats),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _model_gradients(device, dtype, shapes):
    """A model's gradients (`shapes`), the named parameters they belong to, and refill(), untimed
    before each path: every parameter's .grad a fresh copy of its gradient (decompress writes
    its result there)."""
    gen = torch.Generator().manual_seed(1)
    grads = [(torch.randn(shape, generator=gen) * 0.01).to(dtype).to(device) for shape in shapes]
    params = [(f"p{i}", torch.nn.Parameter(torch.empty_like(g))) for i, g in enumerate(grads)]
    buffers = [torch.empty_like(g) for g in grads]

    def refill():
        for (_, param), buffer, grad in zip(params, buffers, grads):
            param.grad = buffer.copy_(grad)
        return ()

    return params, grads, refill


def _model_path_cases(params, refill, label, density):
    """(name, fn, setup) of the whole path of every gradient of a model, on one rank: compress
    each (in backward order, as the hooks fire), Horovod's allreduce of each hand-over (in
    flight together), decompress each; for each method (with the default per-layer policy: 1-D
    tensors and those under 1,024 elements go dense), then for the baseline, Horovod with no
    compression on the same tensors."""
    import horovod.torch as hvd

    hvd.init()

    def path(compression):
        handed = [compression.compress(param.grad) for _, param in reversed(params)]
        handles = [hvd.allreduce_async_(tensor, name=f"bench.model.{i}") for i, (tensor, _) in enumerate(handed)]
        for (_, ctx), handle in zip(handed, handles):
            compression.decompress(hvd.synchronize(handle), ctx)

    makers = _compressor_classes()
    cases = [
        (
            f"{name} whole path, {label} (1 rank)",
            lambda c=makers[name](ratio=density, exchange="allgather", named_parameters=params): path(c),  # noqa: B008
            refill,
        )
        for name in path_methods(density)
    ]
    return cases + [(f"Horovod, no compression, {label} (1 rank)", lambda: path(hvd.Compression.none), refill)]


def _compressor_classes():
    """The compressors whose whole path is timed, by name (imported here: they need Horovod)."""
    from ..torch import DGC, Threshold, TopK

    return {"TopK": TopK, "Threshold": Threshold, "DGC": DGC}


def path_methods(density):
    """The compressors whose whole path is timed at this density (DGC's only at its own
    densities, up to 0.1%)."""
    return ("TopK", "Threshold") + (("DGC",) if density <= 0.001 else ())


def count(density, device="cpu"):
    """Records per size at this density: the 11 kernels (the wire's 3 included), then the whole
    paths (torch's, then TF's)."""
    return 11 + len(path_methods(density)) * (2 if _tf_paths(device) else 1)


def model_count(density):
    """Records per model at this density: the whole paths, then the baseline."""
    return len(path_methods(density)) + 1


def gradient(numel, dtype=torch.float32, device="cpu"):
    """The benchmark's gradient of `numel` elements (the same in every process that times it)."""
    return torch.randn(numel, generator=torch.Generator().manual_seed(0)).to(dtype).to(device)


def memcpy_of(numel, device="cpu"):
    """The baseline: a copy of a float32 buffer of `numel` elements."""
    src = torch.randn(numel, generator=torch.Generator().manual_seed(1)).to(device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def run(
    device="cpu", dtype=torch.float32, sizes=SIZES, densities=DENSITIES, repeats=7, progress=print, models=tuple(MODELS)
):
    device = torch.device(device)
    if not WITH_HOROVOD:
        print("[kernels] Horovod is not installed: the whole-path rows (compressor + Horovod) are left out")
    records = []
    for numel in sizes:
        x = gradient(numel, dtype, device)
        memcpy = memcpy_of(numel, device)
        for density in densities:
            k = selected_count(density, numel)
            topk_ms = median_ms(lambda: torch.topk(x.abs(), k, sorted=False), device, repeats)
            timings = [
                (name, *paired_median_ms(fn, memcpy, device, repeats, setup))
                for name, fn, setup in cases(x, density) + (_path_cases(x, density) if WITH_HOROVOD else [])
            ]
            if _tf_paths(device):
                timings += _tf_path_timings(numel, density, dtype, repeats)
            for name, ms, memcpy_ms in timings:
                records.append(_record(name, numel, density, dtype, device, ms, memcpy_ms, topk_ms))
                progress(records[-1])
    for model in models if WITH_HOROVOD else ():
        records += _model_records(device, dtype, model, densities, repeats, progress)
    return records


def _record(op, numel, density, dtype, device, ms, memcpy_ms, topk_ms, tensors=None):
    """One timing's record (a model's rows also say how many tensors the numel is spread over)."""
    record = {
        "op": op,
        "numel": numel,
        "density": density,
        "dtype": str(dtype).replace("torch.", ""),
        "device": device.type,
        "median_ms": ms,
        "memcpy_ms": memcpy_ms,
        "topk_ms": topk_ms,
    }
    return record if tensors is None else dict(record, tensors=tensors)


def _model_records(device, dtype, model, densities, repeats, progress):
    """Per density, the whole paths of each method on the model's gradients and the baseline
    (Horovod with no compression; sends everything whatever the density), each timed in turn
    with a memcpy of as many float32 elements; topk_ms: a torch.topk(x.abs(), k) per tensor at
    that density, what a compressor that selects per tensor with torch would spend."""
    label, shapes = MODELS[model][0], MODELS[model][1]()
    params, grads, refill = _model_gradients(device, dtype, shapes)
    records = []
    src = torch.randn(sum(math.prod(shape) for shape in shapes), device=device)
    dst = torch.empty_like(src)
    memcpy = lambda: dst.copy_(src)  # noqa: E731
    for density in densities:
        ks = [selected_count(density, g.numel()) for g in grads]
        topk_ms = median_ms(
            lambda: [torch.topk(g.abs().view(-1), k, sorted=False) for g, k in zip(grads, ks)], device, repeats
        )
        for name, fn, setup in _model_path_cases(params, refill, label, density):
            ms, memcpy_ms = paired_median_ms(fn, memcpy, device, repeats, setup)
            records.append(_record(name, src.numel(), density, dtype, device, ms, memcpy_ms, topk_ms, len(shapes)))
            progress(records[-1])
    return records


def table(records):
    width = max([40] + [len(r["op"]) + 2 for r in records])
    header = (
        f"{'op':<{width}}{'numel':>12}{'density':>9}{'dtype':>10}{'device':>7}{'median ms':>11}"
        f"{'x memcpy':>10}{'topk / op':>11}"
    )
    lines = [header, "-" * len(header)]
    for r in records:
        lines.append(
            f"{r['op']:<{width}}{r['numel']:>12,}{r['density']:>9}{r['dtype']:>10}{r['device']:>7}"
            f"{r['median_ms']:>11.3f}{r['median_ms'] / r['memcpy_ms']:>10.2f}"
            f"{r['topk_ms'] / r['median_ms']:>10.1f}x"
        )
    lines.append("")
    lines.append(
        "baselines in the same run: memcpy = float32 copy of the same numel, timed in turn with each op "
        "(its ratio is to that memcpy); topk = torch.topk(x.abs(), k) (a model's rows: one per tensor)"
    )
    lines.append(
        "whole path: compress -> Horovod allreduce of what it hands over -> decompress, one rank, as "
        "hvd.DistributedOptimizer runs it (TF: horovod.tensorflow's allreduce in a tf.function)"
    )
    for numel, density, tensors in sorted({(r["numel"], r["density"], r.get("tensors", 1)) for r in records}):
        mine = [r for r in records if (r["numel"], r["density"], r.get("tensors", 1)) == (numel, density, tensors)]
        copies = [r["memcpy_ms"] for r in mine]
        where = f" in {tensors} tensors" if tensors > 1 else ""
        lines.append(
            f"  numel {numel:>12,}{where}  density {density:<6}  memcpy {min(copies):8.3f} to "
            f"{max(copies):8.3f} ms  topk {mine[0]['topk_ms']:9.3f} ms"
        )
    return "\n".join(lines)


def add_options(p):
    """The kernel benchmark's options (here, and in the repository's benchmarks)."""
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--densities", type=float, nargs="+", default=list(DENSITIES))
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument(
        "--kernel-models",
        nargs="*",
        default=list(MODELS),
        choices=list(MODELS),
        help="models whose gradients' whole path is timed too (default: all; none: no such rows)",
    )


def measure(args, progress_of):
    """The records of add_options' `args`, printed as a table; progress_of(total) gives the
    callback run once per record."""
    per_density = (
        count(d, args.device) * len(args.sizes) + model_count(d) * len(args.kernel_models) for d in args.densities
    )
    dtype = getattr(torch, args.dtype)
    progress = progress_of(sum(per_density))
    records = run(args.device, dtype, args.sizes, args.densities, args.repeats, progress, args.kernel_models)
    print("\n" + table(records))
    return records


def _line_per_record(total):
    return lambda record: print(f"[kernels] {record['op']} {record['numel']:,}", flush=True)


def main():
    parser = argparse.ArgumentParser(prog="python -m sparsecomm.check.kernels", description=__doc__)
    add_options(parser)
    parser.add_argument("--json", help="where to write {'records': [...]}")
    args = parser.parse_args()
    records = measure(args, _line_per_record)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"records": records}, f, indent=1)


if __name__ == "__main__":
    main()
