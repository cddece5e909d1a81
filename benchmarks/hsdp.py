"""Compressed HSDP benchmark (`python -m benchmarks hsdp`): step time of FSDP2 on hosts of several
ranks, each model sharded over the ranks of a host (the mesh's "shard" dimension) and its gradient
shards all-reduced across the hosts (the "replicate" dimension), at each emulated network
(benchmarks.network: per-host, one shaped NIC a host, where namespaces can be made here; else
all ranks behind one shaped loopback, the shared model, which also shapes what the ranks of a
host send each other: FSDP's gathers and reduce-scatters, which per host ride its loopback).

  floor                  fully_shard over the host's ranks, and an all-reduce hook that only
                         divides: every step of HSDP but the replicas' all-reduce
  native HSDP            fully_shard over the 2-D mesh: FSDP all-reduces the shards across the
                         replicas itself, dense (float32)
  HSDP + DGC 0.1%, ...   fully_shard over the host's ranks and sparsecomm.torch.register_fsdp_hook
                         with the compressor across the replicas (HOOKED: the settings and the
                         optimizer momentum of the e2e bench's DDP + rows)

The comm model of the e2e bench (an MLP of 25.2M parameters, 101 MB of gradient, batch 8), so the
rows compare with its DDP rows. As in benchmarks.e2e, every ratio is against rows of the same run:
vs_native = native HSDP's step time / the row's (above 1: faster), vs_floor = the row's / the
floor's, each the median of per-turn ratios where the rows were timed in interleaved turns, with a
95% interval. Bytes between hosts a step: host_sent_bytes, what the ranks of one host send to the
other hosts' (a compressor's stats(), or the ring's share of native HSDP's dense shards), and
where the per-host model runs, nic_sent_bytes, what one host's NIC sent, measured (TCP/IP headers
and the barriers included). link_ms: host_sent_bytes at the link's rate (1000 * bytes / rate, as
benchmarks.report costs bytes), the least time the host's NIC needs for them a step; modelled_ms:
the floor's step of the same run plus link_ms, the step a link-bound exchange that overlaps nothing
would take (benchmarks.scaling's cost model, floor plus exchange, without its 50 us a message)."""

import json
import os
import tempfile

from . import e2e, network

FLOOR = "floor"
NATIVE = "native HSDP"
# name -> (compressor class name in sparsecomm.torch, its settings, SGD's momentum): the e2e bench's
# DDP + rows (DGC and Threshold by allgather, RandomBlock by its shared allreduce; DGC and RandomBlock
# with plain SGD, Threshold with momentum 0.9).
HOOKED = {
    "HSDP + DGC 0.1%": ("DGC", dict(ratio=0.001, momentum=0.9, exchange="allgather"), 0.0),
    "HSDP + Threshold 1%": ("Threshold", dict(ratio=0.01, exchange="allgather"), 0.9),
    "HSDP + RandomBlock 1%": ("RandomBlock", dict(ratio=0.01, seed=1), 0.0),
}
ROWS = (FLOOR, NATIVE, *HOOKED)
# Timed steps of each row: twice the e2e bench's 8 for the comm model. FSDP's gathers and
# reduce-scatters inside a host make every step about 1 s of 4 ranks on this machine's 2 cores,
# whose turns drifted by up to 1.9x in one run: 16 pairs put the median ratio's 95% interval
# between the 4th and 13th of them (8: between the smallest and the largest).
STEPS = 16


def add_options(p):
    """`bench hsdp`'s options."""
    p.add_argument("--networks", nargs="+", default=["1gbit", "10gbit"], help="1gbit, 10gbit, unshaped")
    p.add_argument("--hosts", type=int, default=2, help="replicas: one host each (default 2)")
    p.add_argument("--ranks-per-host", type=int, default=2, help="ranks a host, sharding its model (default 2)")
    p.add_argument("--model", choices=e2e.MODELS, default="comm", help="the e2e bench's (default comm)")
    p.add_argument("--hsdp-methods", dest="methods", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument(
        "--network-model",
        choices=list(network.MODELS),
        help="per-host: a namespace and a shaped NIC a host (default where it can be built); "
        "shared: all ranks behind one shaped loopback",
    )
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=STEPS, help=f"timed steps of each row (default {STEPS})")
    p.add_argument(
        "--rounds",
        type=int,
        help="interleaved turns when every row fits in memory at once (default: --steps; 1: one row at a time)",
    )
    p.add_argument("--json", help="write the records here")


def run(args, log=print):
    """`bench hsdp`: every network's rows, then the table. Returns the records."""
    if args.hosts < 2 or args.ranks_per_host < 1:
        raise SystemExit(f"bench hsdp: needs 2 hosts or more of 1 rank or more, got {args.hosts}x{args.ranks_per_host}")
    records = []
    for net in args.networks:
        rate = None if net == "unshaped" else net
        log(f"\n== {args.model} model, {args.hosts} hosts of {args.ranks_per_host} ranks, {net}, {args.network_model}")
        records += run_one(args, rate, log)
    log("\n" + table(records))
    return records


def run_one(args, rate, log=print):
    """The records of one launch: every row of args.methods at `rate` (None: unshaped)."""
    ranks, per_host = args.hosts * args.ranks_per_host, args.ranks_per_host
    nics = per_host if args.network_model == "per-host" else 1  # the shared model: one link for all
    steps = args.steps
    rounds = args.rounds or steps
    if e2e.rows_at_once(args.model, args.hosts) < len(args.methods):  # a rank holds 1/per_host of each row
        rounds = 1
    worker = ["--model", args.model, "--ranks-per-host", str(per_host), "--warmup", str(args.warmup)]
    worker += ["--steps", str(steps), "--rounds", str(rounds), "--methods", *args.methods]
    with tempfile.TemporaryDirectory() as tmp, network.emulated(args.network_model, rate, ranks, nics) as placed:
        out = os.path.join(tmp, "records.json")
        placed.launch(ranks, "benchmarks.hsdp_worker", worker + ["--out", out], "[hsdp]", log)
        with open(out) as f:
            records = json.load(f)
    for record in records:
        record["network"] = placed.rate or "unshaped"
        record["network_model"] = e2e.layout_model(placed.model, nics)
        record["ranks_per_host"] = per_host
    add_ratios(records)
    return records


def add_ratios(records):
    """vs_native, vs_floor (with their 95% intervals, or None) and link_ms of the records of one
    launch; None where the baseline or the link's rate is missing."""
    by_method = {r["method"]: r for r in records}
    native, floor = by_method.get(NATIVE), by_method.get(FLOOR)
    for record in records:
        record["vs_native"], record["vs_native_interval"] = (
            e2e.step_ratio(record, native, speedup=True) if native else (None, None)
        )
        record["vs_floor"], record["vs_floor_interval"] = e2e.step_ratio(record, floor) if floor else (None, None)
        rate = network.RATES.get(record["network"])
        record["link_ms"] = 1000 * record["host_sent_bytes"] / rate if rate else None
        known = floor is not None and record["link_ms"] is not None
        record["modelled_ms"] = floor["step_ms"] + record["link_ms"] if known else None


def _mb(value):
    return "-" if value is None else f"{value / 1e6:.3f}"


def _ms(value):
    return "-" if value is None else f"{value:.1f}"


def table(records):
    """A text table: one row per (network, method)."""
    header = (
        f"{'model':<8}{'layout':>7}  {'network':<9}{'net model':<10}{'method':<23}{'ms/step':>9}"
        f"{'vs native':>20}{'vs floor':>20}{'host MB/step':>14}{'NIC MB/step':>13}{'link ms':>9}{'floor+link':>12}"
    )
    lines = [header, "-" * len(header)]
    for r in records:
        layout = e2e.layout_text(r)
        lines.append(
            f"{r['model']:<8}{layout:>7}  {r['network']:<9}{r['network_model'].partition(',')[0]:<10}"
            f"{r['method']:<23}{r['step_ms']:>9.1f}"
            f"{e2e.ratio_text(r['vs_native'], r['vs_native_interval']):>20}"
            f"{e2e.ratio_text(r['vs_floor'], r['vs_floor_interval']):>20}"
            f"{_mb(r['host_sent_bytes']):>14}{_mb(r.get('nic_sent_bytes')):>13}{_ms(r['link_ms']):>9}"
            f"{_ms(r['modelled_ms']):>12}"
        )
    return "\n".join(lines)
