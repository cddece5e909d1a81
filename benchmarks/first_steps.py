"""The first steps of a new job, exchange="auto" beside each fixed exchange (`bench trial`): auto
watches and trials its routes in its first steps, which its steady step time (timed after them)
hides, and a job that stops early pays them. Each row is built fresh (its compressor's first steps
are what a new job sees) and timed one at a time on the comm model at 1 Gbit/s, in several
launches that each start with another row: the mean of its first 30 and 100 step times, and the
first 30's mean over the fastest fixed exchange's in the same run (auto is meant to be within
1.15x of it)."""

import argparse
import statistics

from . import e2e

COUNTS = (30, 100)  # the means of the first steps a record holds, where it kept that many
AGAINST = 30  # the mean set against the fastest fixed exchange's
RATIO = f"first_{AGAINST}_vs_fastest_fixed"  # a record's key for it
WITHIN = 1.15  # auto's first 30 steps: at most this over the fastest fixed exchange's
AUTO = "DGC 0.1% auto"
FIXED = ("DGC 0.1% allgather", "DGC 0.1% spardl")
HOSTS_FIXED = ("DGC 0.1% hierarchical",)  # where hosts hold several ranks
MODEL = "comm"
NETWORK = "1gbit"
LAYOUTS = ((2, 1), (4, 2))  # 2 ranks of a host each, 2 hosts of 2 ranks
# Runs first in every launch, and is left out of the records: the first row of a process pays its
# first allocations and kernels (a second more at 2 x 2 hosts), which no row should carry.
LEAD = "floor"


def rows(per_host):
    """The rows of a cell: auto, then each exchange alone (hierarchical where hosts hold several
    ranks: its process sets are then registered, for auto too)."""
    return (AUTO, *FIXED, *(HOSTS_FIXED if per_host > 1 else ()))


def layout(text):
    """`--layouts`' N (N ranks, a host each) or HxR (H hosts of R ranks): (ranks, ranks a host)."""
    hosts, x, per_host = text.partition("x")
    if not x and hosts.isdigit() and int(hosts) >= 2:
        return int(hosts), 1
    if x and hosts.isdigit() and per_host.isdigit() and int(hosts) >= 2 and int(per_host) >= 2:
        return int(hosts) * int(per_host), int(per_host)
    raise argparse.ArgumentTypeError(f"a layout should be N (ranks >= 2) or HxR (both >= 2), got {text!r}")


def means(times_ms, counts=COUNTS):
    """{"30": the mean of the first 30 step times, ...} for each of `counts` they reach (JSON's keys
    are strings)."""
    return {str(n): statistics.fmean(times_ms[:n]) for n in counts if 0 < n <= len(times_ms)}


def first_mean(record, count=AGAINST):
    """A record's mean of its first `count` steps, or None where it kept fewer."""
    return record.get("first_steps_mean_ms", {}).get(str(count))


def against_fastest(records):
    """The records of one cell, each with RATIO: its first AGAINST steps' mean over the fastest
    fixed row's (auto's is the figure the issue judges; a fixed row's says how far from the best
    it starts); None where there is no such mean."""
    fixed = [first_mean(r) for r in records if r["method"] != AUTO and first_mean(r) is not None]
    fastest = min(fixed, default=None)
    for record in records:
        mine = first_mean(record)
        record[RATIO] = None if mine is None or fastest is None else mine / fastest
    return records


def rotated(methods, repeat):
    """The rows in the order of launch `repeat`: each launch starts one row further on, so that no
    row always pays a new process's first steps (its first allocations and connections)."""
    shift = repeat % len(methods)
    return [*methods[shift:], *methods[:shift]]


def merged(launches):
    """One record a row (LEAD's left out) from the records of several launches of a cell: its first
    step times and their means averaged step by step over the launches, its steady step the
    median of theirs."""
    by_method = {}
    for records in launches:
        for record in records:
            if record["method"] != LEAD:
                by_method.setdefault(record["method"], []).append(record)
    rows = []
    for records in by_method.values():
        first = [r["first_steps_ms"] for r in records if "first_steps_ms" in r]
        row = dict(records[0], step_ms=statistics.median(r["step_ms"] for r in records), launches=len(records))
        if first:
            row["first_steps_ms"] = [statistics.fmean(times) for times in zip(*first)]
            row["first_steps_mean_ms"] = means(row["first_steps_ms"])
        rows.append(row)
    return rows


def run(layouts, network_model, first_steps, warmup, steps, launches=3, log=print):
    """The records of every cell of `layouts` ((ranks, ranks a host)): `launches` launches a cell,
    the rows one at a time in rotated order after LEAD, each keeping its `first_steps` first step times
    (merged over the launches); hosts of several ranks only on the per-host network model (left
    out, and said, elsewhere)."""
    records = []
    for ranks, per_host in layouts:
        if per_host > 1 and network_model != "per-host":
            log(f"[trial] no {e2e.layout_label(ranks, per_host)} cell: hosts need the per-host network model")
            continue
        log(f"\n== {MODEL} model, {e2e.layout_label(ranks, per_host)} ranks, {NETWORK}, {network_model} network model")
        runs = [
            e2e.run_one(
                ranks,
                NETWORK,
                MODEL,
                [LEAD, *rotated(list(rows(per_host)), repeat)],
                warmup,
                steps,
                log,
                network_model=network_model,
                rounds=1,
                ranks_per_host=per_host,
                first_steps=first_steps,
            )
            for repeat in range(launches)
        ]
        records += against_fastest(merged(runs))
    return records


def _ms(value):
    return "-" if value is None else f"{value:.1f}"


def table_rows(records):
    """(row, first 30 ms, first 100 ms, steady ms, first 30 vs fastest fixed) a record: one figure a
    column, "-" where the record has none."""
    return [
        (
            r["method"],
            *(_ms(first_mean(r, n)) for n in COUNTS),
            _ms(r["step_ms"]),
            e2e.ratio_text(r.get(RATIO)),
        )
        for r in records
    ]


HEADER = ("row", "first 30 ms", "first 100 ms", "steady ms", "first 30 vs fastest fixed")
WIDTHS = (24, 13, 14, 11, 27)


def cells(records):
    """{(model, ranks, ranks a host, network, network model): its records}, in the records' order."""
    found = {}
    for r in records:
        key = (r["model"], r["ranks"], r.get("ranks_per_host", 1), r["network"], r["network_model"])
        found.setdefault(key, []).append(r)
    return found


def _line(values):
    return "".join(f"{v:<{w}}" if i == 0 else f"{v:>{w}}" for i, (v, w) in enumerate(zip(values, WIDTHS)))


def table(records):
    """A text table a cell (model, ranks, network, network model), HEADER's columns."""
    blocks = []
    for (model, ranks, per_host, net, netmodel), mine in cells(records).items():
        title = f"{model} model, {e2e.layout_label(ranks, per_host)} ranks, {net} ({netmodel.partition(',')[0]})"
        blocks.append("\n".join([title, _line(HEADER), "-" * sum(WIDTHS), *map(_line, table_rows(mine))]))
    return "\n\n".join(blocks)
