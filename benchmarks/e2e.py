"""End-to-end benchmark: step time of a communication-heavy and a compute-heavy model, with no
exchange at all (the floor), dense allreduce, each sparsecomm method and PyTorch DDP (plain,
fp16, PowerSGD), on an emulated 1 Gbit/s and 10 Gbit/s network (benchmarks.network,
per-host NICs or one shared link) and unshaped. Every ratio is against rows measured in the same
run (same model, ranks and network): vs_dense = dense step time / this row's (speedup_vs_dense
is the same figure, kept for older readers), vs_floor = this row's step time / the floor's, paired
step by step where the rows were timed in interleaved turns (step_ratio), and for a method with a
`local` row, vs_local = its vs floor / its local row's (local_ratio): what its exchange adds to
the floor plus its kernels."""

import json
import math
import os
import statistics
import tempfile

from . import network

NETWORKS = ("1gbit", "10gbit", None)  # None: unshaped
# Timed steps of each row, each paired with a baseline's step of the same turn. The compute
# model's steps are short and noisy (4 ranks share 2 cores): 48 pairs give the median ratio a 95%
# interval from the 17th to the 32nd (16 pairs, from the 4th to the 13th, left it 20% wide, wider
# than the 3% that exchange="auto" is judged by); 8 pairs, the comm model's, from the smallest to
# the largest.
STEPS = {"comm": 8, "comm-small": 8, "compute": 48}
# The models (benchmarks.e2e_worker.model_and_batch): MLPs, a large gradient for little compute, by
# their widths (outer, hidden), and a CNN. comm-small has a quarter of comm's parameters in the same
# layers: the same exchanges at a quarter of the bytes, for quick runs such as the tests.
MLP_WIDTHS = {"comm": (1024, 4096), "comm-small": (512, 2048)}
MODELS = (*MLP_WIDTHS, "compute")


def mlp_name(model):
    """An MLP model's layers, as the demo prints them: 'MLP 1024-4096-4096-1024'."""
    outer, hidden = MLP_WIDTHS[model]
    return f"MLP {outer}-{hidden}-{hidden}-{outer}"


# A step's phases, timed apart by the worker: zero_grad and the forward pass; the backward pass
# (where Horovod's hooks call compress and start the exchanges); the optimizer's step (where
# Horovod waits for the exchanges, calls decompress, then steps the parameters).
PHASES = ("forward", "backward", "step")


# Bytes a row holds per parameter: the parameters, their gradient, the optimizer's momentum, a
# compressor's residual and DGC's momentum (float32 each), with Horovod's and DDP's buffers.
ROW_BYTES_PER_PARAMETER = 24


def rows_at_once(model, ranks, available=None):
    """How many rows of `model` fit, on every rank at once, in half of `available` bytes (default:
    the memory available now): the compute model's all, the comm model's (25.2M parameters, about
    0.6 GB a row per rank) a few."""
    import psutil
    import torch

    from .e2e_worker import model_and_batch

    with torch.device("meta"):  # counted, not allocated
        parameters = sum(p.numel() for p in model_and_batch(model)[0].parameters())
    available = psutil.virtual_memory().available if available is None else available
    return int(available / 2 // (ranks * parameters * ROW_BYTES_PER_PARAMETER))


def interleaving(model, ranks, methods, rounds, available=None):
    """(rounds, group size) for the worker: the rows timed in `rounds` interleaved turns, all at
    once where they fit in memory, else in groups that each hold the baselines (floor and dense)
    and as many other rows as fit; (1, 0), one row at a time, where not even the baselines and
    one more row fit."""
    from .e2e_worker import BASELINES

    size = rows_at_once(model, ranks, available)
    if rounds > 1 and size >= len(methods):
        return rounds, 0
    if rounds > 1 and size >= sum(m in BASELINES for m in methods) + 1:
        return rounds, size
    return 1, 0


def run_one(
    ranks,
    net,
    model,
    methods,
    warmup,
    steps,
    log=print,
    network_model="shared",
    rounds=1,
    ranks_per_host=1,
    first_steps=0,
):
    """Records of one launch (all rows for one model, ranks and network) on `network_model`
    (per-host: hosts of `ranks_per_host` ranks), timed in `rounds` interleaved turns, in groups
    that fit in memory (see the worker); with `first_steps` N, the rows with an exchange keep
    their first N step times (the worker's --first-steps)."""
    rounds, group_size = interleaving(model, ranks, methods, rounds)
    placement = network.emulated(network_model, net, ranks, ranks_per_host)
    with tempfile.TemporaryDirectory() as tmp, placement as placed:
        out = os.path.join(tmp, "records.json")
        placed.launch(
            ranks,
            "benchmarks.e2e_worker",
            [
                "--model",
                model,
                "--out",
                out,
                "--warmup",
                str(warmup),
                "--steps",
                str(steps),
                "--rounds",
                str(rounds),
                "--group-size",
                str(group_size),
                *(["--first-steps", str(first_steps)] if first_steps else []),
                "--methods",
                *methods,
            ],
            "[e2e]",
            log,
        )
        with open(out) as f:
            records = json.load(f)
    for record in records:
        record["network"] = placed.rate or "unshaped"
        record["network_model"] = layout_model(placed.model, ranks_per_host)
        record["ranks_per_host"] = ranks_per_host
        record["group_size"] = group_size
    add_ratios(records)
    return records


def add_ratios(records):
    """vs_dense (and speedup_vs_dense) and vs_floor of records from one run, with their 95%
    intervals where the rows were paired (else None); None without the dense or floor row."""
    by_method = {r["method"]: r for r in records}
    dense, floor = by_method.get("dense"), by_method.get("floor")
    for record in records:
        vs_dense, record["vs_dense_interval"] = step_ratio(record, dense, speedup=True) if dense else (None, None)
        record["speedup_vs_dense"] = record["vs_dense"] = vs_dense
        record["vs_floor"], record["vs_floor_interval"] = step_ratio(record, floor) if floor else (None, None)
    for local in records:
        method = by_method.get(local.get("local_of"))
        if method is not None and floor is not None:
            method["vs_local"], method["vs_local_interval"] = local_ratio(method, local, floor)


def _paired(record, baseline, speedup=False):
    """The per-turn ratios of a row timed in interleaved turns to the baseline's steps of the same
    turns (record's / the baseline's, or the inverse with `speedup`), or None where they were not
    paired."""
    mine = record.get("step_times_ms")
    theirs = record.get("baselines", {}).get(baseline["method"], baseline.get("step_times_ms"))
    if min(record.get("rounds", 1), baseline.get("rounds", 1)) > 1 and mine and theirs and len(mine) == len(theirs):
        return [t / m if speedup else m / t for m, t in zip(mine, theirs)]
    return None


def step_ratio(record, baseline, speedup=False):
    """(record's step time / the baseline's, or the baseline's / record's with `speedup`; a 95%
    interval of it or None). Rows timed in interleaved turns are paired step by step with the
    baseline's steps in the same turns (seconds apart, so the machine's drift, which moves a step
    by tens of percent, falls on both alike; a row timed in a group of rows has its group's
    baseline steps in record["baselines"]): the median of the per-turn ratios, and the interval
    of that median. Rows timed one at a time: the ratio of their medians, no interval."""
    ratios = _paired(record, baseline, speedup)
    if ratios is not None:
        return statistics.median(ratios), median_interval(ratios)
    if speedup:
        return baseline["step_ms"] / record["step_ms"], None
    return record["step_ms"] / baseline["step_ms"], None


def local_ratio(method, local, floor):
    """(the method's step time / its local row's, a 95% interval or None). Where both were paired
    with the floor turn by turn, the ratio of the two per-turn ratios to the floor, turn by turn
    (each step of the method and of its local row over the floor's of its own turn, so the drift
    cancels even where the two rows were timed in different groups), and its median; else the
    ratio of their medians."""
    mine, theirs = _paired(method, floor), _paired(local, floor)
    if mine is not None and theirs is not None and len(mine) == len(theirs):
        ratios = [m / t for m, t in zip(mine, theirs)]
        return statistics.median(ratios), median_interval(ratios)
    return method["step_ms"] / local["step_ms"], None


def median_interval(values, confidence=0.95):
    """A distribution-free `confidence` interval of the median of `values`, from their order
    statistics: the median lies below the j-th smallest of n with probability P(Binomial(n, 1/2)
    < j), so [j-th smallest, j-th largest] for the largest j whose two tails stay within
    1 - confidence. None where n is too small for any (n < 6 at 95%)."""
    n, tail = len(values), (1 - confidence) / 2
    j, below = 0, 0.0
    while j < n and below + math.comb(n, j) / 2**n <= tail:
        below += math.comb(n, j) / 2**n
        j += 1
    if j == 0:
        return None
    ordered = sorted(values)
    return [ordered[j - 1], ordered[n - j]]


def ratio_text(value, interval=None):
    """1.23x, with its 95% interval where there is one: 1.23x (1.10-1.31)."""
    if value is None:
        return "-"
    return f"{value:.2f}x" + ("" if interval is None else f" ({interval[0]:.2f}-{interval[1]:.2f})")


HOSTS_SUFFIX = ", hosts of "  # what layout_model adds to the network model of hosts of several ranks


def layout_model(network_model, ranks_per_host):
    """The network model a record names: hosts of several ranks apart from hosts of one, so that no
    table, floor or check mixes a 2 x 2 layout with 4 ranks of one NIC each."""
    return network_model if ranks_per_host == 1 else f"{network_model}{HOSTS_SUFFIX}{ranks_per_host}"


def ranks_per_host(network_model):
    """The ranks a host of a record's network model holds (layout_model's inverse)."""
    return int(network_model.partition(HOSTS_SUFFIX)[2] or 1)


def layout_label(ranks, per_host):
    """ "4" ranks, or "2x2" for 2 hosts of 2 ranks."""
    return str(ranks) if per_host == 1 else f"{ranks // per_host}x{per_host}"


def layout_text(record):
    """The ranks of a record, as layout_label writes them."""
    return layout_label(record["ranks"], record.get("ranks_per_host", 1))


def table(records):
    """A text table: one row per (model, ranks, network, method)."""
    header = (
        f"{'model':<8}{'ranks':>6}  {'network':<9}{'net model':<10}{'method':<21}{'ms/step':>10}"
        f"{'vs dense':>20}{'vs floor':>20}{'recv MB/rank/step':>19}  exchange"
    )
    lines = [header, "-" * len(header)]
    for r in records:
        netmodel = r["network_model"].partition(",")[0]  # the ranks column shows the hosts
        lines.append(
            f"{r['model']:<8}{layout_text(r):>6}  {r['network']:<9}{netmodel:<10}{r['method']:<21}"
            f"{r['step_ms']:>10.1f}{ratio_text(r['vs_dense'], r.get('vs_dense_interval')):>20}"
            f"{ratio_text(r['vs_floor'], r.get('vs_floor_interval')):>20}"
            f"{r['received_bytes'] / 1e6:>19.3f}  {','.join(r['exchanges'])}"
        )
    timed = [r for r in records if "phases_ms" in r]
    if timed:  # where the step goes: each phase's median on its slowest rank (the worker's PHASES)
        lines += [
            "",
            f"{'model':<8}{'ranks':>6}  {'network':<9}{'method':<21}"
            + "".join(f"{p:>10}" for p in PHASES)
            + f"{'vs local':>20}",
        ]
        for r in timed:
            lines.append(
                f"{r['model']:<8}{layout_text(r):>6}  {r['network']:<9}{r['method']:<21}"
                + "".join(f"{r['phases_ms'][p]:>10.1f}" for p in PHASES)
                + f"{ratio_text(r.get('vs_local'), r.get('vs_local_interval')):>20}"
            )
    return "\n".join(lines)
