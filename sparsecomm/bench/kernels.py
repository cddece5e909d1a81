"""Kernel benchmark: every sparsecomm kernel on realistic sizes, with the baselines measured
in the same run (memcpy of the same float32 buffer and torch.topk(x.abs(), k)), so the
ratios carry to other machines; and the whole path of TopK, Threshold and DGC (at densities
up to 0.1%) on one rank, compress -> Horovod allreduce -> decompress, against the same memcpy.
Medians of repeated runs after a warm-up. Each op's memcpy is timed in turn with the op
itself, call for call, so a machine whose speed drifts (a shared host) moves both alike."""
import statistics
import time

import torch

from ..torch import ops

SIZES = (1_000_000, 25_557_032)  # 25,557,032 = one ResNet-50 gradient
DENSITIES = (0.001, 0.01)


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
    k = max(1, int(density * numel + 0.5))
    residual0 = torch.randn(numel, device=x.device) * 0.01
    threshold = ops.sample_threshold(x, residual0, density)

    def fresh_residual():
        return (residual0.clone(),)

    values, index = ops.pack_topk(x, None, k)
    dense = torch.empty_like(x)
    return [
        ("sample_threshold", lambda r: ops.sample_threshold(x, r, density), fresh_residual),
        ("pack_above (fused EF threshold pack)", lambda r: ops.pack_above(x, r, threshold), fresh_residual),
        ("pack_sampled (estimate + pack + band)", lambda r: ops.pack_sampled(x, r, density), fresh_residual),
        ("pack_topk (exact top-k, EF)", lambda r: ops.pack_topk(x, r, k), fresh_residual),
        ("topk (exact, no EF)", lambda: ops.pack_topk(x, None, k), None),
        ("block_pack (random block, EF)", lambda r: ops.block_pack(x, r, 12345 % numel, k), fresh_residual),
        ("sparse_unpack (k values, into a buffer)", lambda: ops.sparse_unpack(values, index, numel, out=dense), None),
        ("block_unpack (k values, into a buffer)", lambda: ops.block_unpack(values, numel, 12345 % numel, out=dense),
         None),
    ]


def _path_cases(x, density):
    """(name, fn, setup) of a compressor's whole path on one rank, as hvd.DistributedOptimizer
    runs it: compress -> Horovod allreduce (of what compress hands over) -> decompress. The
    gradient buffer is refilled before each call (untimed): decompress writes its result there."""
    import horovod.torch as hvd
    from ..torch import DGC, Threshold, TopK
    hvd.init()
    param = torch.nn.Parameter(torch.empty_like(x))
    grad = torch.empty_like(x)
    makers = {"TopK": TopK, "Threshold": Threshold, "DGC": DGC}
    cases = []
    for name in _path_methods(density):
        make = makers[name]
        compressor = make(ratio=density, exchange="allgather", named_parameters=[("w", param)], min_numel=0,
                          dense_1d=False)

        def path(compressor=compressor):
            handed, ctx = compressor.compress(param.grad)
            compressor.decompress(hvd.allreduce_(handed, name="bench.path"), ctx)

        def refill():
            param.grad = grad.copy_(x)
            return ()
        cases.append((f"{name} whole path (1 rank)", path, refill))
    return cases


def _path_methods(density):
    """The compressors whose whole path is timed at this density (DGC's only at its own
    densities, up to 0.1%)."""
    return ("TopK", "Threshold") + (("DGC",) if density <= 0.001 else ())


def count(density):
    """Records per size at this density: the 8 kernels, then the whole paths."""
    return 8 + len(_path_methods(density))


def run(device="cpu", dtype=torch.float32, sizes=SIZES, densities=DENSITIES, repeats=7, progress=print):
    device = torch.device(device)
    records = []
    for numel in sizes:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(numel, generator=gen).to(dtype).to(device)
        src = torch.randn(numel, generator=gen).to(device)  # memcpy baseline: float32, same numel
        dst = torch.empty_like(src)
        memcpy = lambda: dst.copy_(src)  # noqa: E731
        for density in densities:
            k = max(1, int(density * numel + 0.5))
            topk_ms = median_ms(lambda: torch.topk(x.abs(), k, sorted=False), device, repeats)
            for name, fn, setup in cases(x, density) + _path_cases(x, density):
                ms, memcpy_ms = paired_median_ms(fn, memcpy, device, repeats, setup)
                record = {"op": name, "numel": numel, "density": density, "dtype": str(dtype).replace("torch.", ""),
                          "device": device.type, "median_ms": ms, "memcpy_ms": memcpy_ms, "topk_ms": topk_ms}
                records.append(record)
                progress(record)
    return records


def table(records):
    header = (f"{'op':<40}{'numel':>12}{'density':>9}{'dtype':>10}{'device':>7}{'median ms':>11}"
              f"{'x memcpy':>10}{'topk / op':>11}")
    lines = [header, "-" * len(header)]
    for r in records:
        lines.append(f"{r['op']:<40}{r['numel']:>12,}{r['density']:>9}{r['dtype']:>10}{r['device']:>7}"
                     f"{r['median_ms']:>11.3f}{r['median_ms'] / r['memcpy_ms']:>10.2f}"
                     f"{r['topk_ms'] / r['median_ms']:>10.1f}x")
    lines.append("")
    lines.append("baselines in the same run: memcpy = float32 copy of the same numel, timed in turn with each op "
                 "(its ratio is to that memcpy); topk = torch.topk(x.abs(), k)")
    lines.append("whole path: compress -> Horovod allreduce of what it hands over -> decompress, one rank, as "
                 "hvd.DistributedOptimizer runs it")
    for numel, density in sorted({(r["numel"], r["density"]) for r in records}):
        mine = [r for r in records if (r["numel"], r["density"]) == (numel, density)]
        copies = [r["memcpy_ms"] for r in mine]
        lines.append(f"  numel {numel:>12,}  density {density:<6}  memcpy {min(copies):8.3f} to {max(copies):8.3f} ms"
                     f"  topk {mine[0]['topk_ms']:9.3f} ms")
    return "\n".join(lines)
