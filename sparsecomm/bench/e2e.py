"""End-to-end benchmark: step time of a communication-heavy and a compute-heavy model, with no
exchange at all (the floor), dense allreduce, each sparsecomm method and PyTorch DDP (plain,
fp16, PowerSGD), on an emulated 1 Gbit/s and 10 Gbit/s network (sparsecomm.bench.network,
per-host NICs or one shared link) and unshaped. Every ratio is against rows measured in the same
run (same model, ranks and network): vs_dense = dense step time / this row's (speedup_vs_dense
is the same figure, kept for older readers), vs_floor = this row's step time / the floor's."""
import json
import os
import tempfile

from . import network

NETWORKS = ("1gbit", "10gbit", None)  # None: unshaped


# Bytes a row holds per parameter: the parameters, their gradient, the optimizer's momentum, a
# compressor's residual and DGC's momentum (float32 each), with Horovod's and DDP's buffers.
ROW_BYTES_PER_PARAMETER = 24


def interleaved_rounds(model, ranks, rows, rounds, available=None):
    """`rounds` where every row of every rank fits in half of `available` bytes (default: the
    memory available now), else 1: one row at a time (the comm model's 13 rows take about 8 GB
    per rank)."""
    import psutil
    from .e2e_worker import model_and_batch
    parameters = sum(p.numel() for p in model_and_batch(model)[0].parameters())
    available = psutil.virtual_memory().available if available is None else available
    return rounds if ranks * rows * parameters * ROW_BYTES_PER_PARAMETER <= available / 2 else 1


def run_one(ranks, net, model, methods, warmup, steps, log=print, network_model="shared", rounds=1):
    """Records of one launch (all rows for one model, ranks and network) on `network_model`,
    timed in `rounds` interleaved turns where the rows fit in memory together (see the worker)."""
    rounds = interleaved_rounds(model, ranks, len(methods), rounds) if rounds > 1 else 1
    with tempfile.TemporaryDirectory() as tmp, network.emulated(network_model, net, ranks) as placed:
        out = os.path.join(tmp, "records.json")
        placed.launch(ranks, "sparsecomm.bench.e2e_worker",
                      ["--model", model, "--out", out, "--warmup", str(warmup), "--steps", str(steps),
                       "--rounds", str(rounds), "--methods", *methods], "[e2e]", log)
        with open(out) as f:
            records = json.load(f)
    for record in records:
        record["network"] = placed.rate or "unshaped"
        record["network_model"] = placed.model
    add_ratios(records)
    return records


def add_ratios(records):
    """vs_dense (and speedup_vs_dense) and vs_floor of records from one run; None without the
    dense or floor row."""
    step = {r["method"]: r["step_ms"] for r in records}
    for record in records:
        vs_dense = step["dense"] / record["step_ms"] if "dense" in step else None
        record["speedup_vs_dense"] = record["vs_dense"] = vs_dense
        record["vs_floor"] = record["step_ms"] / step["floor"] if "floor" in step else None


def _ratio(value):
    return "-" if value is None else f"{value:.2f}x"


def table(records):
    """A text table: one row per (model, ranks, network, method)."""
    header = (f"{'model':<8}{'ranks':>6}  {'network':<9}{'net model':<10}{'method':<21}{'ms/step':>10}"
              f"{'vs dense':>10}{'vs floor':>10}{'recv MB/rank/step':>19}  exchange")
    lines = [header, "-" * len(header)]
    for r in records:
        lines.append(f"{r['model']:<8}{r['ranks']:>6}  {r['network']:<9}{r['network_model']:<10}{r['method']:<21}"
                     f"{r['step_ms']:>10.1f}{_ratio(r['vs_dense']):>10}{_ratio(r['vs_floor']):>10}"
                     f"{r['received_bytes'] / 1e6:>19.3f}  {','.join(r['exchanges'])}")
    return "\n".join(lines)
