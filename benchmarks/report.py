"""Figures (PNG) and docs/results.md from the benchmark records.

`write` draws the figures and writes the page from a results dict (the run's results.json):
`python -m benchmarks all` calls it after measuring, `python -m benchmarks report`
on a recorded run, measuring nothing. The page: a summary table, the figures, one table per
kind of result (a row per configuration, a column per number), how it was measured last."""

import os
import platform
import re
import shlex
import statistics
import textwrap

from . import first_steps, scaling
from .convergence import change_text, final_text, final_value_text
from .e2e import HOSTS_SUFFIX, PHASES, layout_label, local_ratio, ranks_per_host, ratio_text
from .network import RATES

TASK_TITLES = {
    "digits": "CNN on digits",
    "charlm": "char GRU on stdlib sources",
    "wordlm": "word GRU on Wikipedia text",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def speed_figure(records, path):
    """Speedup vs dense per method, one panel per (model, ranks, network model), one bar group
    per network."""
    plt = _plt()
    panels = sorted({(r["model"], r["ranks"], r["network_model"]) for r in records})
    networks = [n for n in ("1gbit", "10gbit", "unshaped") if any(r["network"] == n for r in records)]
    methods = list(dict.fromkeys(r["method"] for r in records))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    width = 0.8 / max(1, len(networks))
    for ax, (model, ranks, netmodel) in zip(axes[0], panels):
        for j, net in enumerate(networks):
            values = [
                next(
                    (
                        r["speedup_vs_dense"] or 0
                        for r in records
                        if (r["model"], r["ranks"], r["network_model"], r["network"], r["method"])
                        == (model, ranks, netmodel, net, m)
                    ),
                    0,
                )
                for m in methods
            ]
            ax.bar([i + j * width for i in range(len(methods))], values, width, label=net)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + width * (len(networks) - 1) / 2 for i in range(len(methods))])
        ax.set_xticklabels(methods, rotation=60, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"{model} model, {_ranks_label(ranks, netmodel)}, {netmodel.partition(',')[0]} network")
        ax.set_ylabel("speedup vs dense (same run)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def convergence_figure(records, path):
    plt = _plt()
    tasks = list(dict.fromkeys(r["task"] for r in records))
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for r in (r for r in records if r["task"] == task):
            ax.plot(
                range(1, len(r["curve"]) + 1),
                r["curve"],
                label=r["method"],
                linewidth=2.2 if r["method"] == "dense" else 1.2,
            )
        ax.set_xlabel("epoch")
        ax.set_ylabel(
            {"digits": "test accuracy", "wordlm": "validation loss (nats/word)"}.get(
                task, "validation loss (nats/char)"
            )
        )
        ax.set_title(TASK_TITLES.get(task, task))
        if task == "digits":
            ax.set_ylim(0.8, 1.0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine():
    import torch

    cores = os.cpu_count()
    return (
        f"{platform.machine()} Linux, {cores} CPU cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}, Horovod 0.28.1 (Gloo)"
    )


def code_version():
    """The commit of the code being measured (with -dirty for uncommitted changes), or None
    outside a git checkout."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(os.path.abspath(__file__)),
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    return out.stdout.strip()


def relative_command(command, root=None):
    """`command` with every absolute path in it made relative to `root` (default: the working
    directory, the checkout's root under `make bench`); a path outside `root` keeps its name only.
    The page then names no directory of the machine that made it."""
    root = os.path.abspath(root or os.getcwd())

    def relative(word):
        if not os.path.isabs(word):
            return word
        inside = os.path.commonpath([root, os.path.abspath(word)]) == root
        return os.path.relpath(word, root) if inside else os.path.basename(word.rstrip("/"))

    return shlex.join(relative(word) for word in shlex.split(command))


def convergence_source(earlier, path):
    """Where reused convergence records were trained: the run that trained them, however many
    runs have reused them since (`earlier` is the results.json read from `path`)."""
    if "convergence_from" in earlier:  # itself a reuse: pass its source on
        return earlier["convergence_from"]
    command = f"`{earlier['command']}`" if "command" in earlier else path
    return f"{command} on {earlier['commit']}" if earlier.get("commit") else command


def with_convergence_of(results, run, path):
    """`results` with the convergence records of `run`, read from `path`: what `bench convergence
    --json` writes (records, command, commit) or another run's results.json."""
    records = run["records"] if "records" in run else run["convergence"]
    return dict(results, convergence=records, convergence_from=convergence_source(run, path))


def with_convergence_added(results, run, path):
    """`results` with a `bench convergence --json` run's records (read from `path`) in place of
    the records of the same task and method, the others kept where they are, new ones after
    them; convergence_from names the added run beside the earlier source."""
    added = {(r["task"], r["method"]): r for r in run["records"]}
    records = [added.pop((r["task"], r["method"]), r) for r in results["convergence"]]
    records += added.values()  # rows no earlier record had
    tasks = sorted({r["task"] for r in run["records"]})
    earlier = results.get("convergence_from") or f"`{results['command']}` on {results.get('commit')}"
    source = f"{earlier}; {len(run['records'])} {'/'.join(tasks)} rows by {convergence_source(run, path)}"
    return dict(results, convergence=records, convergence_from=source)


def _para(text):
    """A paragraph (or a "- " list item) wrapped at 100 characters."""
    return textwrap.fill(
        text,
        100,
        subsequent_indent="  " if text.startswith("- ") else "",
        break_long_words=False,
        break_on_hyphens=False,
    )


def _md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# -- the records, in the page's order --------------------------------------------------------

NETWORK_ORDER = ("1gbit", "10gbit", "unshaped")
MODELS = {
    "comm": "an MLP 1024-4096-4096-1024, 25.2M parameters, 101 MB of gradient, batch 8",
    "compute": "a CNN on 32x32x3 images, 0.29M parameters, batch 32",
}
SHORT = {"comm": "an MLP with 101 MB of gradient", "compute": "a small CNN"}
# The peers a user compares with, as the summary names them: Horovod's own compression and
# PyTorch DDP's communication hooks.
PEERS = {"dense fp16": "Horovod fp16", "DDP fp16": "DDP fp16 hook", "DDP PowerSGD": "DDP PowerSGD hook"}
EXCHANGES = ("allgather", "spardl", "auto")  # a method's e2e rows are named "<method> <exchange>"
DDP_HOOK = "DDP + "  # a DDP hook row is named "DDP + <method>" (its Horovod row: horovod_twin)
AUTO = "DGC 0.1% auto"
# auto is to be within 3% of the fastest row of its cell that sends every tensor one way, or
# faster: dense, or its method by each of these exchanges ("<method> <exchange>" rows).
ROUTES_ALONE = ("allgather", "spardl", "hierarchical")
WITHIN = 0.97
VERDICTS = (
    "within 3% of the fastest or faster",
    "slower at the median, but its interval reaches the 3% margin: not told apart from it",
    "**slower than the fastest by more than 3%**",
)


def _networks(records):
    return sorted({r["network"] for r in records}, key=lambda n: (NETWORK_ORDER + (n,)).index(n))


def _ordered(values):
    return list(dict.fromkeys(values))


def _cell_of(records, model, netmodel, ranks, network, method):
    return next(
        (
            r
            for r in records
            if (r["model"], r["network_model"], r["ranks"], r["network"], r["method"])
            == (model, netmodel, ranks, network, method)
        ),
        None,
    )


def _cells(e2e):
    """(network model, ranks, network, its records) of the comm-model runs, in a stable order."""
    keys = sorted(
        {(r["network_model"], r["ranks"], r["network"]) for r in e2e if r["model"] == "comm"},
        key=lambda c: (c[0], c[1], (NETWORK_ORDER + (c[2],)).index(c[2])),
    )
    for netmodel, ranks, net in keys:
        yield (
            netmodel,
            ranks,
            net,
            [
                r
                for r in e2e
                if (r["model"], r["network_model"], r["ranks"], r["network"]) == ("comm", netmodel, ranks, net)
            ],
        )


def _joined(values, sep=" / "):
    """One value where all are the same, else each in turn: 0.239 / 0.240 / 0.234."""
    distinct = _ordered(values)
    return distinct[0] if len(distinct) == 1 else sep.join(values)


# -- summary ---------------------------------------------------------------------------------


def _trained_as(method, trained):
    """The convergence method an e2e row runs: its own name, or its name less the exchange (and
    less "DDP + ": a DDP hook row runs its Horovod row's compressor)."""
    method = method.removeprefix(DDP_HOOK)
    if method in trained:
        return method
    name, _, exchange = method.rpartition(" ")
    return name if exchange in EXCHANGES and name in trained else None


def _speed(value):
    return "-" if value is None else f"{value:.1f}x"


def _summary(results):
    """The summary table: per method, its speed against dense and each peer on the summary
    model's shaped networks (a cell per network, 2 ranks / 4 ranks in it), and its accuracy."""
    e2e, conv = results["e2e"], results["convergence"]
    model = "comm" if any(r["model"] == "comm" for r in e2e) else next((r["model"] for r in e2e), None)
    rows = [r for r in e2e if r["model"] == model]
    netmodel = (
        "per-host"
        if any(r["network_model"] == "per-host" for r in rows)
        else next((r["network_model"] for r in rows), None)
    )
    rows = [r for r in rows if r["network_model"] == netmodel]
    networks = [n for n in ("1gbit", "10gbit") if any(r["network"] == n for r in rows)] or _networks(rows)
    ranks = sorted({r["ranks"] for r in rows})
    peers = [p for p in PEERS if any(r["method"] == p for r in rows)]
    tasks = _ordered(r["task"] for r in conv)
    trained = {(r["task"], r["method"]): r for r in conv}
    timed = ["dense"] + _ordered(r["method"] for r in rows if r["family"] == "sparsecomm")
    methods = timed

    def against(method, network, peer):
        cells = []
        for n in ranks:
            mine = _cell_of(rows, model, netmodel, n, network, method)
            theirs = None if peer is None else _cell_of(rows, model, netmodel, n, network, peer)
            if mine is None or (peer is not None and (theirs is None or not mine["vs_floor"])):
                cells.append(None)
            else:
                cells.append(mine["vs_dense"] if peer is None else (theirs["vs_floor"] or 0) / mine["vs_floor"])
        return " / ".join(_speed(c) for c in cells)

    header = ["method"] + [f"{n} vs {PEERS.get(p, 'dense')}" for n in networks for p in [None, *peers]]
    metric = {r["task"]: r["metric"] for r in conv}
    header += [f"{t} {'accuracy' if metric[t] == 'accuracy' else 'loss'}" for t in tasks]
    table = []
    for method in methods:
        row = [method] + [against(method, n, p) for n in networks for p in [None, *peers]]
        for task in tasks:
            record = trained.get((task, _trained_as(method, {m for t, m in trained if t == task}) or method))
            row.append("-" if record is None else final_text(record, trained.get((task, "dense"))))
        table.append(row)
    described = f"the {model} model ({SHORT[model]})" if model in SHORT else f"the {model} model"
    intro = (
        f"Speed on {described}, {netmodel} network, {' / '.join(f'{n} ranks' for n in ranks)} in each "
        f"cell: above 1.0x the method is faster than the dense or peer row of the same run."
    )
    return "\n".join([_para(intro), "", _md_table(header, table), "", *_summary_notes(e2e, conv, model)])


def _summary_notes(e2e, conv, model):
    """The summary's bullets: the ranks the accuracy comes from, and the other models' speeds."""
    lines = []
    if conv:
        trained_ranks = " or ".join(_ordered(str(r.get("ranks", "?")) for r in conv))
        lines.append(
            _para(
                f"- Accuracy on {trained_ranks} ranks, with the change against dense (a loss is better "
                f"when lower). More methods and the intervals: below."
            )
        )
    other = [r for r in e2e if r["model"] != model and r["family"] == "sparsecomm" and r["vs_dense"] is not None]
    if other:
        low, high = min(r["vs_dense"] for r in other), max(r["vs_dense"] for r in other)
        names = " and ".join(f"the {m} model" for m in _ordered(r["model"] for r in other))
        auto = [r for r in other if r["method"] == AUTO]
        dense = " `auto` sends it all dense." if auto and all(r["exchanges"] == ["dense"] for r in auto) else ""
        lines.append(
            _para(
                f"- On {names}, compute dominates: every method runs at {low:.2f}x to {high:.2f}x of "
                f"dense's speed.{dense}"
            )
        )
    return lines


# -- end-to-end tables -----------------------------------------------------------------------


def _e2e_tables(e2e):
    """Per network model: a row per (model, method); its received MB and exchange (per ranks),
    then per (ranks, network) its ms/step, vs dense and vs floor."""
    blocks = []
    for netmodel in sorted({r["network_model"] for r in e2e}):
        rows = [r for r in e2e if r["network_model"] == netmodel]
        ranks = sorted({r["ranks"] for r in rows})
        cells = [(n, net) for n in ranks for net in _networks(rows)]
        labels = {n: _ranks_label(n, netmodel) for n in ranks}
        header = ["model", "method", f"received MB ({' / '.join(labels.values())})", "exchange"]
        for n, net in cells:
            header += [f"{labels[n]} {net} ms/step", "vs dense", "vs floor"]
        body = []
        for model, method in _ordered((r["model"], r["method"]) for r in rows):
            found = [_cell_of(rows, model, netmodel, n, net, method) for n, net in cells]
            per_ranks = [[c for (m, _), c in zip(cells, found) if m == n and c is not None] for n in ranks]
            row = [
                model,
                method,
                " / ".join(
                    _joined([f"{c['received_bytes'] / 1e6:.3f}" for c in have], ", ") for have in per_ranks if have
                ),
                _joined(
                    [", ".join(_ordered(e for c in have for e in c["exchanges"])) or "-" for have in per_ranks if have]
                ),
            ]
            for c in found:
                row += (
                    ["", "", ""]
                    if c is None
                    else [
                        f"{c['step_ms']:.1f}",
                        ratio_text(c.get("vs_dense"), c.get("vs_dense_interval")),
                        ratio_text(c.get("vs_floor"), c.get("vs_floor_interval")),
                    ]
                )
            body.append(row)
        named = len({r["network_model"] for r in e2e}) > 1 or ranks_per_host(netmodel) > 1
        blocks.append((f"**{netmodel.capitalize()} network.**\n\n" if named else "") + _md_table(header, body))
    return "\n\n".join(blocks)


def _ranks_label(ranks, netmodel):
    """A cell's ranks: "4 ranks", or "2x2" on the network model of hosts of 2 ranks."""
    per_host = ranks_per_host(netmodel)
    return f"{ranks} ranks" if per_host == 1 else layout_label(ranks, per_host)


def _verdict(speedup, interval):
    if speedup >= WITHIN:
        return VERDICTS[0]
    if interval is not None and interval[1] >= WITHIN:
        return VERDICTS[1]
    return VERDICTS[2]


def _against_fastest(auto, e2e):
    """(the route of auto's cell that is fastest alone: dense or one of ROUTES_ALONE, its step over
    auto's, a 95% interval or None): paired turn by turn through dense where both were, else of
    medians; dense alone where the cell has no other (vs_dense)."""
    key, method = (
        (auto["model"], auto["network_model"], auto["ranks"], auto["network"]),
        auto["method"].rpartition(" ")[0],
    )
    rows = {route: _cell_of(e2e, *key, f"{method} {route}") for route in ROUTES_ALONE}
    rows = {route: r for route, r in rows.items() if r and r.get("step_ms")}
    dense = _cell_of(e2e, *key, "dense")
    fastest = min(rows, key=lambda route: rows[route]["step_ms"], default=None)
    if fastest is None or (dense is not None and dense["step_ms"] <= rows[fastest]["step_ms"]):
        return "dense", auto["vs_dense"], auto.get("vs_dense_interval")
    alone = rows[fastest]
    slower, interval = local_ratio(auto, alone, dense) if dense else (auto["step_ms"] / alone["step_ms"], None)
    return fastest, 1 / slower, interval and [1 / interval[1], 1 / interval[0]]


AUTO_HEADER = (
    "model",
    "ranks",
    "network",
    "vs dense",
    "vs the fastest route alone",
    "sent by",
    "route trial, ms a step",
    "median turn / model",
    "kept",
    "compress hooks, ms a step",
    "verdict",
)


def _auto_rows(e2e):
    """Per cell: how exchange="auto" (DGC 0.1%) compares with dense and with the fastest of its
    routes alone (dense, ROUTES_ALONE), its route trial, the time of its compress hooks, and whether
    that meets "within 3% of the fastest or faster" given the interval of the paired ratio
    (AUTO_HEADER's columns)."""
    rows = []
    for r in e2e:
        if r["method"] != AUTO or r["vs_dense"] is None:
            continue
        trial = r.get("route_trial") or {}
        sides = ", ".join(f"{side} {ms:.0f}" for side, ms in trial.get("step_ms", {}).items()) or "-"
        pair = _trial_ratios(trial)
        hooks = "-" if "compress_ms" not in r else f"{r['compress_ms']:.2f} ({r['compress_ms'] / r['step_ms']:.1%})"
        fastest, speedup, interval = _against_fastest(r, e2e)
        rows.append(
            (
                r["model"],
                r["ranks"],
                f"{r['network']} ({r['network_model']})",
                ratio_text(r["vs_dense"], r.get("vs_dense_interval")),
                f"{ratio_text(speedup, interval)} of {fastest}",
                ", ".join(r["exchanges"]) or "-",
                sides,
                pair,
                trial.get("kept", "-"),
                hooks,
                _verdict(speedup, interval),
            )
        )
    return rows


def _trial_ratios(trial):
    """Each alternative's median turn ratio to the model's routes (a record before the trial of
    several alternatives: its one median pair's), over the steps counted."""
    if "ratios" in trial:
        ratios = ", ".join(f"{side} {ratio:.2f}" for side, ratio in trial["ratios"].items())
    elif "ratio" in trial:
        ratios = f"{trial['ratio']:.2f}"
    else:
        return "-"
    return f"{ratios} over {trial['steps']} steps"


def _auto_block(e2e, said=True):
    """The table of _auto_rows, after what it means (`said`; an added run's: its title alone)."""
    rows = _auto_rows(e2e)
    if not rows:
        return ""
    if not said:
        return f'**exchange="auto" against its routes alone.**\n\n{_md_table(AUTO_HEADER, rows)}\n\n'
    return f"""**exchange="auto" against its routes alone** (DGC 0.1%): meant to be within 3% of the fastest
of the rows of its cell that send every tensor one way (dense, allgather, SparDL, hierarchical), or
faster; above 1.00x auto is faster.

{_md_table(AUTO_HEADER, rows)}

"""


def _phase_rows(e2e):
    """(header, rows): a row per comm-model cell (ranks, network); per method shown (the floor,
    the synced floor, each local row and its method) the ms of each phase where they were timed,
    then each method with a local row over that row (its kernels alone: what its exchange adds).
    Cells with neither are left out."""
    cells = []
    for netmodel, ranks, net, cell in _cells(e2e):
        by = {r["method"]: r for r in cell}
        timed = {m: r for m, r in by.items() if "phases_ms" in r}
        shown = ["floor", "floor synced"] + [
            m for r in by.values() if r["family"] == "local" for m in (r["method"], r["local_of"])
        ]
        over = {
            r["local_of"]: by[r["local_of"]]
            for r in by.values()
            if r["family"] == "local" and by.get(r["local_of"], {}).get("vs_local") is not None
        }
        shown = [m for m in _ordered(shown) if m in timed]
        if shown or over:
            cells.append((layout_label(ranks, ranks_per_host(netmodel)), net, timed, shown, over))
    methods = _ordered(m for *_, shown, _ in cells for m in shown)
    locals_of = _ordered(m for *_, over in cells for m in over)
    header = (
        ["ranks", "network"]
        + [f"{m} {p}" if i == 0 else p for m in methods for i, p in enumerate(PHASES)]
        + [f"{m} over kernels alone" for m in locals_of]
    )
    rows = [
        (
            ranks,
            net,
            *(f"{timed[m]['phases_ms'][p]:.1f}" if m in timed else "-" for m in methods for p in PHASES),
            *(
                ratio_text(over[m]["vs_local"], over[m].get("vs_local_interval")) if m in over else "-"
                for m in locals_of
            ),
        )
        for ranks, net, timed, _, over in cells
    ]
    return header, rows


def _phase_block(e2e):
    header, rows = _phase_rows(e2e)
    if not rows:
        return ""
    return f"""**Where a step's time goes** (comm model): ms per phase, medians on the slowest rank; and each
method over its kernels alone (its `local` row), which is what its exchange adds.

{_md_table(header, rows)}

"""


def _timing(e2e):
    """How each model's rows were timed: in interleaved turns (all at once, or in groups), or one
    row at a time."""
    parts = []
    for model in sorted({r["model"] for r in e2e}):
        rows = [r for r in e2e if r["model"] == model]
        how = []
        for n in sorted({r.get("rounds", 1) for r in rows}):
            if n == 1:
                how.append("one row at a time (its rows do not fit in memory together)")
                continue
            sizes = sorted({r.get("group_size", 0) for r in rows if r.get("rounds", 1) == n} - {0})
            together = "every row built first"
            if sizes:
                listed = ", ".join(map(str, sizes[:-1])) + (" or " if len(sizes) > 1 else "") + str(sizes[-1])
                together = f"in groups of {listed} rows that fit in memory together, each with the floor and dense"
            how.append(f"in {n} interleaved turns ({together})")
        parts.append(_para(f"- The {model} model's rows were timed {' or '.join(how)}."))
    return "\n".join(parts)


# -- the same compressor, two ways in: Horovod and DDP's hook -------------------------------

WAYS_HEADER = (
    "ranks",
    "network",
    "method",
    "Horovod ms/step",
    "vs floor",
    "DDP hook ms/step",
    "vs floor",
    "DDP hook / Horovod",
    "DDP hook vs DDP PowerSGD",
    "received MB Horovod / DDP",
    "backward + step ms Horovod / DDP",
)


def _over(by, horovod, ddp):
    """(the DDP row's step over the Horovod row's, a 95% interval or None): paired turn by turn
    through the floor where both were (rows of different groups ran minutes apart), else of medians."""
    floor = by.get("floor")
    return local_ratio(ddp, horovod, floor) if floor is not None else (ddp["step_ms"] / horovod["step_ms"], None)


def _twins(records):
    """(cell records, the Horovod row, its DDP + row) of each comm-model cell that has both."""
    for _, _, _, cell in _cells(records):
        by = {r["method"]: r for r in cell}
        for ddp in cell:
            horovod = by.get(ddp.get("horovod_twin"))
            if horovod is not None:
                yield by, horovod, ddp


def _ways_rows(records):
    """WAYS_HEADER's rows: per comm cell and method timed both ways, each way's step and vs floor,
    the DDP row's step over the Horovod row's (paired turn by turn through the floor where both
    were, as a method over its local row is), the DDP row against DDP PowerSGD (PowerSGD's vs
    floor over the row's: above 1.0x the row is faster), the MB each receives, and the phases
    where the exchange is waited for (backward, step)."""
    rows = []
    for by, horovod, ddp in _twins(records):
        powersgd = by.get("DDP PowerSGD")
        against = None
        if powersgd is not None and powersgd.get("vs_floor") and ddp.get("vs_floor"):
            against = powersgd["vs_floor"] / ddp["vs_floor"]
        waits = [
            "-" if "phases_ms" not in r else f"{r['phases_ms']['backward']:.0f} + {r['phases_ms']['step']:.0f}"
            for r in (horovod, ddp)
        ]
        rows.append(
            (
                ddp["ranks"],
                ddp["network"],
                ddp["method"].removeprefix(DDP_HOOK),
                f"{horovod['step_ms']:.1f}",
                ratio_text(horovod.get("vs_floor"), horovod.get("vs_floor_interval")),
                f"{ddp['step_ms']:.1f}",
                ratio_text(ddp.get("vs_floor"), ddp.get("vs_floor_interval")),
                ratio_text(*_over(by, horovod, ddp)),
                ratio_text(against),
                f"{horovod['received_bytes'] / 1e6:.3f} / {ddp['received_bytes'] / 1e6:.3f}",
                " / ".join(waits),
            )
        )
    return rows


def _ways_block(records):
    rows = _ways_rows(records)
    if not rows:
        return ""
    return f"""**Horovod or DDP** (comm model): each method through Horovod and as DDP's communication
hook, in the same run. DDP hook / Horovod: below 1.00x the hook is faster.

{_md_table(WAYS_HEADER, rows)}

{_ways_text(records)}

"""


def _ways_text(records):
    """Where each way in is faster, and where each waits for the exchange (Horovod: in the
    optimizer's step, after the backward pass; DDP: inside the backward pass, which also runs the
    hook's compress and unpack), from the measured figures; and the bytes the hook's padding adds."""
    pairs = [(horovod, ddp, _over(by, horovod, ddp)[0]) for by, horovod, ddp in _twins(records)]
    wins = [p for p in pairs if p[2] < 1]
    losses = [p for p in pairs if p[2] >= 1]
    said = f"DDP's hook in {len(wins)} of {len(pairs)} pairs" + (f" ({_pairs_text(wins)})" if wins else "")
    if losses:  # by how much, not each pair: the table lists them
        ratios = [r for *_, r in losses]
        median = statistics.median(ratios)
        said += f"; Horovod in the other {len(losses)}, by {_span(ratios, '.2f')}x (median {median:.2f}x)"
    lines = [
        _para(
            f"- **Faster way in:** {said}. Where the interval of DDP hook / Horovod holds 1.00x, this run does "
            "not tell them apart."
        )
    ]
    timed = [p for p in pairs if "phases_ms" in p[0] and "phases_ms" in p[1]]
    if timed:
        phase = lambda way, name: [p[way]["phases_ms"][name] for p in timed]  # noqa: E731
        longer = [d["phases_ms"]["backward"] - h["phases_ms"]["backward"] for h, d, _ in timed]
        lines.append(
            _para(
                f"- **Where each waits:** Horovod waits for the exchanges after the backward pass, in the "
                f"optimizer's step ({_span(phase(0, 'step'))} ms, decompress included). DDP waits inside the "
                f"backward pass, which also runs the hook's compress and unpack: it is {_span(longer)} ms longer "
                f"than Horovod's, and DDP's step is the SGD update alone ({_span(phase(1, 'step'))} ms)."
            )
        )
    gathered = [(h, d) for h, d, _ in pairs if h["received_bytes"] and "allgather" in d["exchanges"]]
    if gathered:
        more = [d["received_bytes"] / h["received_bytes"] for h, d in gathered]
        shaped = [(h, d) for h, d in gathered if d["network"] in RATES]
        costs = [1000 * (d["received_bytes"] - h["received_bytes"]) / RATES[d["network"]] for h, d in shaped]
        cost = f", {_span(costs, '.1f')} ms a step at the shaped rates: not what sets the ways apart" if costs else ""
        lines.append(
            _para(
                f"- **Bytes:** the hook gathers each parameter's rows padded to a capacity the same on every "
                f"rank (one all_gather, no size exchange first): it receives {_span(more, '.2f')}x the MB of "
                f"Horovod's allgather{cost}."
            )
        )
    return "\n".join(lines)


def _pairs_text(pairs):
    def cell(d):
        return f"{_ranks_label(d['ranks'], d['network_model'])} {d['network']}"

    return ", ".join(f"{d['method'].removeprefix(DDP_HOOK)} at {cell(d)} {r:.2f}x" for _, d, r in pairs)


def _span(values, spec=".0f"):
    low, high = min(values), max(values)
    return f"{low:{spec}}" if f"{low:{spec}}" == f"{high:{spec}}" else f"{low:{spec}} to {high:{spec}}"


# -- runs added to the record ----------------------------------------------------------------


def _cells_of(records):
    return {(r["model"], r["ranks"], r["network"], r["network_model"]) for r in records}


def add_run(results, run):
    """`results` with an e2e run (what `bench e2e --json` writes: its records, command, commit
    and minutes) under "e2e_added": the page shows it apart from the run of record, so that every
    ratio stays against a baseline of its own run. It replaces the added runs whose cells (model,
    ranks, network, network model) it covers. A later `make bench` times every row itself and
    writes a results.json without them."""
    cells = _cells_of(run["records"])
    kept = [r for r in results.get("e2e_added", []) if not _cells_of(r["records"]) <= cells]
    added = {key: run.get(key) for key in ("command", "commit", "minutes")}
    return dict(results, e2e_added=kept + [dict(added, records=run["records"])])


def _added_block(results):
    """Each added run: what ran it, its table (as the run of record's), its auto and its Horovod
    or DDP blocks."""
    blocks = []
    for run in results.get("e2e_added", []):
        made = f"`{relative_command(run['command'])}`" if run.get("command") else "A run"
        code = f" on {run['commit']}" if run.get("commit") else ""
        minutes = f", {run['minutes']:.0f} minutes" if run.get("minutes") is not None else ""
        said = _para(f"{made}{code}{minutes}: its ratios are against its own floor and dense.")
        records = run["records"]
        parts = (
            said,
            _e2e_tables(records),
            _auto_block(records, said=False).strip("\n"),
            _ways_block(records).strip("\n"),
        )
        blocks.append("\n\n".join(part for part in parts if part))
    if not blocks:
        return ""
    intro = _para(
        "Rows timed after the run of record, in runs of their own (added by `python -m benchmarks "
        "report --add-e2e`), on the same machine kind."
    )
    return "### Runs added to the record\n\n" + intro + "\n\n" + "\n\n".join(blocks).rstrip("\n") + "\n\n"


# -- the first steps of exchange="auto" -------------------------------------------------------

FIRST_STEPS_HEADER = ("ranks", "network", *first_steps.HEADER)


def _first_steps_block(trial, source=None):
    """`bench trial`'s records (results["trial"]), a row each: a new job's first steps, auto's watch
    and route trial among them, beside each fixed exchange's; "" where the run has none. `source`:
    the command that timed them, where another run than the page's did (results["trial_from"])."""
    if not trial:
        return ""
    rows = [
        (layout_label(r["ranks"], r.get("ranks_per_host", 1)), r["network"], *row)
        for r, row in zip(trial, first_steps.table_rows(trial))
    ]
    launches = max(r.get("launches", 1) for r in trial)
    intro = _para(
        'DGC 0.1% with exchange="auto" and with each exchange alone, each row from a freshly built '
        "compressor, one row at a time after a row that pays the process's first steps, in "
        f"{launches} launches a cell, each started by another row, averaged step by step: the mean of "
        "its first 30 and 100 step times (slowest rank), its steady step (the median launch's median "
        "after them), and its first 30 steps' mean over the fastest fixed exchange's in the same cell "
        f"(auto is meant to be within {first_steps.WITHIN:.2f}x)."
        + (f" These rows were timed by {source}." if source else "")
    )
    return f"## First steps of exchange=auto\n\n{intro}\n\n{_md_table(FIRST_STEPS_HEADER, rows)}\n\n"


# -- convergence and kernels -----------------------------------------------------------------


def _convergence_rows(conv):
    """(header, rows): a row per method, per task its final value (the mean over the seeds and
    their range), the change against dense and the bytes dense sends per step over the method's."""
    tasks = _ordered(r["task"] for r in conv)
    by = {(r["task"], r["method"]): r for r in conv}
    rows = []
    for method in _ordered(r["method"] for r in conv):
        row = [method]
        for task in tasks:
            r, dense = by.get((task, method)), by.get((task, "dense"))
            if r is None:
                row += ["-", "-", "-"]
                continue
            saved = r["dense_bytes_per_step"] / max(r["sent_bytes_per_step"], 1)
            row += [final_value_text(r), "-" if dense is None else change_text(r, dense), f"{saved:.0f}x"]
        rows.append(row)
    metric = {r["task"]: r["metric"] for r in conv}
    header = ["method"] + [
        h
        for t in tasks
        for h in (f"{t} {'accuracy' if metric[t] == 'accuracy' else 'loss'}", "vs dense", "bytes/step vs dense")
    ]
    return header, rows


def _data_text(conv):
    """Which data each task's records were trained on, one line per task and data (the worker
    records it: the stdlib corpus changes between Python releases)."""
    lines = []
    for task in dict.fromkeys(r["task"] for r in conv):
        kinds = []
        for r in conv:
            if r["task"] == task and r.get("data") not in kinds:
                kinds.append(r.get("data"))
        for d in kinds:
            lines.append(
                f"- {task} data: "
                + (
                    f"{d['source']}, sha256 {d['sha256'][:16]}."
                    if d
                    else "not recorded by the run that trained these records."
                )
            )
        if len(kinds) > 1:
            lines.append(f"- **{task}'s methods were not all trained on the same data**: compare them with care.")
    return "\n".join(lines)


def _kernel_rows(kernels):
    """(header, rows): a row per kernel; per (numel, density) its median ms, that over a memcpy
    of the same numel, and torch.topk's time over it."""
    groups = _ordered((k["numel"], k["density"]) for k in kernels)
    by = {(k["op"], k["numel"], k["density"]): k for k in kernels}
    header = ["kernel"] + [
        h for numel, density in groups for h in (f"{numel:,} at {density:g}: ms", "/ memcpy", "topk / this")
    ]
    rows = []
    for op in _ordered(k["op"] for k in kernels):
        row = [op]
        for numel, density in groups:
            k = by.get((op, numel, density))
            row += (
                ["", "", ""]
                if k is None
                else [
                    f"{k['median_ms']:.3f}",
                    f"{k['median_ms'] / k['memcpy_ms']:.2f}",
                    f"{k['topk_ms'] / k['median_ms']:.2f}",
                ]
            )
        rows.append(row)
    return header, rows


def _model_rows_text(kernels):
    """What a model's rows are, where the run has them (`bench kernels --kernel-models`)."""
    if not any("tensors" in k for k in kernels):
        return ""
    return (
        " A \"ResNet-50's 161 tensors\" row runs it on ResNet-50's gradients, 25.6M elements in tensors of "
        "64 to 2.4M (1-D ones and those under 1,024 elements dense), one torch.topk per tensor."
    )


def _of_code(results):
    return f", code {results['commit']}" if results.get("commit") else ""


def _reused(results):
    if "convergence_from" not in results:
        return ""
    return (
        f"\nThese convergence records were trained by another run ({results['convergence_from']}), not by this one.\n"
    )


# -- how it was measured ---------------------------------------------------------------------

NETWORK_MODELS = {
    "per-host": """Each rank has a network namespace and a veth pair to a bridge, both ends shaped by `tc ... tbf`:
hosts with one full-duplex NIC each on a non-blocking switch. Unshaped: no tbf.""",
    "shared": """The ranks of one `horovodrun --gloo` run share one namespace whose loopback `tc ... tbf` shapes:
ONE link for all, like a small cluster behind one switch port. Unshaped: plain loopback.""",
}
HOSTS_OF = """Hosts of several ranks (`--ranks-per-host`): a network namespace a host, its ranks
talking over its own loopback (unshaped), and one veth pair a host to the bridge, both ends shaped:
hosts of several GPUs with one NIC each. The model's check takes the link inside a host as
`cost.HOST_LINK`, far faster than this loopback."""


def _network_model_text(name):
    """What a network model of the records is: NETWORK_MODELS' own, or hosts of several ranks."""
    base, _, hosts = name.partition(HOSTS_SUFFIX)  # "2", or "several ranks" for a run's models
    return NETWORK_MODELS[base] if not hosts else HOSTS_OF


RATIOS = """```
ms/step            = median over the timed steps of the slowest rank's step time
vs dense           = dense's ms/step / this row's       (above 1.00x: faster than dense)
vs floor           = this row's ms/step / the floor's   (1.00x: the exchange costs nothing)
over kernels alone = this row's vs floor / its local row's vs floor
received MB        = MB one rank receives per step      (dense: 2 (N-1)/N of the gradient)
predicted ms/step  = floor + sum over the model's tensors of cost.costs(exchange)   (scaling)
error              = predicted / measured - 1
```"""
ROWS = """- **Floor and peers.** `floor`: the step with no exchange, which none can beat. `floor synced`
  adds a 1-element allreduce: the ranks wait for each other once a step, as every exchanging row
  must. All step SGD with momentum 0.9, except DGC (its own) and RandomBlock (plain SGD). Peers:
  PyTorch DDP on gloo, same worker and network: `DDP dense`, `DDP fp16` (`fp16_compress_hook`),
  `DDP PowerSGD` (`powerSGD_hook`, rank 4, error feedback, warm start, one bucket). Every DDP
  row passes `gradient_as_bucket_view=True` (runs before 2026-11-26 did not).
- **DDP + rows.** `DDP + DGC 0.1%` and the like: DDP (default buckets) with our compressor as its
  communication hook, `sparsecomm.torch.ddp_hook`, with the settings and optimizer of the method's
  Horovod row (DGC's: `DGC 0.1% allgather`).
  Their received MB counts each gathered parameter at its padded capacity: what the hook sends.
- **Local rows and phases.** A `local` row runs its method's compressor on a process set of each
  rank alone: every kernel, nothing sent. forward: zero_grad and forward. backward: Horovod's hooks
  compress and start the exchanges. step: Horovod waits, decompresses, and the optimizer steps.
- **exchange="auto"** is within 3% of the fastest of its routes alone (the cell's dense, DGC
  allgather, SparDL and hierarchical rows) at 0.97x or more, paired through dense turn by turn;
  not told apart where only its interval reaches 0.97x. Route trial:
  [exchanges.md](exchanges.md#overlap-with-the-backward-pass).
- **Noise.** The ranks share this machine's cores: 4-rank and compute-model rows carry noise of
  tens of percent. Off 1 Gbit/s, dense fp16 is slow on CPU (software half precision)."""


def _training_text(conv):
    """How the convergence records trained: the shared schedule where the records carry it."""
    if not conv or any("schedule" not in r for r in conv):  # records of a run before the shared schedule
        return "Every method trains on 2 ranks, same seeds, data order and epochs."
    seeds = sorted({s for r in conv for s in (r.get("seeds") or [r.get("seed", 0)])})
    tasks = {r["task"]: r["schedule"] for r in conv}
    each = "; ".join(
        f"{task}: learning rate {c['lr']} after a linear warm-up of {c['warmup_epochs']} "
        f"epoch{'' if c['warmup_epochs'] == 1 else 's'}, "
        + (f"the averaged gradient clipped to norm {c['clip_norm']}" if c["clip_norm"] else "no clipping")
        for task, c in tasks.items()
    )
    return (
        f"Every method trains on 2 ranks on the same schedule, once per seed ({', '.join(map(str, seeds))}: "
        f"initial weights and data order; a final value is the mean [the range]). {each}. DGC's density "
        "warm-up runs over the same steps, and DGC clips locally at the norm / sqrt(N) (its paper's rule). "
        "Optimizer momentum 0.9, except DGC (its own) and RandomBlock (plain SGD: with momentum it diverges, "
        "[random_block.md](random_block.md))."
    )


def _dense_flat_text(conv):
    """Where dense ends on each task: its last epochs, to show the runs are long enough."""

    def shown(record):
        last, epochs = record["curve"][-3:], len(record["curve"])
        values = ", ".join(f"{v:.1%}" if record["metric"] == "accuracy" else f"{v:.3f}" for v in last)
        return f"{record['task']} {values} (epochs {epochs - 2}-{epochs})"

    ends = [shown(r) for r in conv if r["method"] == "dense" and len(r["curve"]) >= 3]
    return f" Dense has flattened by the end: {'; '.join(ends)}." if ends else ""


def _method_section(results, rel, scaling_method):
    e2e = results["e2e"]
    models = "\n".join(f"- {m} model: {MODELS[m]}." for m in _ordered(r["model"] for r in e2e) if m in MODELS)
    added = [r for run in results.get("e2e_added", []) for r in run["records"]]
    netmodels = "\n\n".join(
        f"### Network model: {m}\n\n{_network_model_text(m)}"
        for m in sorted(
            {re.sub(rf"{HOSTS_SUFFIX}\d+", f"{HOSTS_SUFFIX}several ranks", r["network_model"]) for r in e2e + added}
        )
    )
    runs = _para(
        _training_text(results["convergence"])
        + _dense_flat_text(results["convergence"])
        + " digits: a small CNN, 1,437 training / "
        "360 held-out images. charlm: a GRU (64-dim embedding, 192 hidden) on the Python standard library's "
        "sources (600 kB, last 10% held out). wordlm: a GRU (64-dim embedding, 128 hidden, the 5,000 most "
        "frequent words) on the first 250k words of the Wikipedia sample gensim's wheel ships for its tests, as "
        "gensim's parser reads it (last 10% held out). Kernels are timed in turn with a float32 memcpy of the "
        'same numel and torch.topk(x.abs(), k) ([kernels.md](kernels.md#measured-speed-cpu)). A "whole path '
        '(1 rank)" row is compress, Horovod\'s allreduce and decompress; a "TF" row the same in a tf.function.'
        + _model_rows_text(results["kernels"])
    )
    ran = _para(
        f"`make bench` ran `{relative_command(results['command'])}` for {results['minutes']:.0f} "
        f"minutes{_of_code(results)}. `python -m benchmarks report` rewrites this page from it."
    )
    return f"""## How it was measured

{ran}

{netmodels}

### Timing

{models}
{_timing(e2e)}
- Each turn starts one row further on, so drift falls on all rows alike. A ratio is the median of
  the rows' step ratios in the same turns, with a 95% interval; one row at a time: of medians.

{RATIOS}

{ROWS}

### Convergence and kernel runs

{runs}

{scaling_method}
"""


def write_markdown(results, out, path):
    """docs/results.md: a summary, the figures, the tables of this run, and how it was measured.
    `out`: the folder of the figures and results.json; links on the page are relative to it."""
    rel = os.path.relpath(out, os.path.dirname(os.path.abspath(path)) or ".")
    conv_header, conv_rows = _convergence_rows(results["convergence"])
    kernel_header, kernel_rows = _kernel_rows(results["kernels"])
    scaled = scaling.parts(results, out)
    e2e = results["e2e"]
    first = _first_steps_block(results.get("trial"), results.get("trial_from"))
    top = _para(
        f"`make bench` on {results['machine']}; every ratio is against a baseline of the same run. "
        f"Raw records: [{rel}/results.json]({rel}/results.json); the method: [last](#how-it-was-measured)."
    )
    text = f"""# Results

{top}

## Summary

{_summary(results)}

## Figures

![speedup]({rel}/e2e_speedup.png)
![convergence]({rel}/convergence.png)
![scaling]({rel}/scaling.png)

## End-to-end step time on an emulated network

Per ranks and network: ms/step, vs dense and vs floor ([Timing](#timing)), with the 95% interval
in brackets. Received MB per rank and step, per network where they differ.

{_e2e_tables(e2e)}

{_auto_block(e2e)}{_phase_block(e2e)}{_ways_block(e2e)}{_added_block(results)}{first}## Convergence on real data
{_reused(results)}
Final test accuracy (digits) or validation loss (charlm, wordlm); bytes: dense's per step over the method's.

{_md_table(conv_header, conv_rows)}

{_data_text(results["convergence"])}

## Kernels

Per size and density: median ms, that over a memcpy, and torch.topk's time over it.

{_md_table(kernel_header, kernel_rows)}

{scaled["tables"]}

{_method_section(results, rel, scaled["method"])}"""
    with open(path, "w") as f:
        f.write(text.rstrip("\n") + "\n")


def figure_records(results):
    """The e2e records the speedup figure shows: the run of record's, then the rows of each added
    run that the run of record lacks in that cell (each bar is a ratio to dense of its own run)."""
    records = list(results["e2e"])
    for run in results.get("e2e_added", []):
        have = {(r["model"], r["ranks"], r["network"], r["network_model"], r["method"]) for r in records}
        records += [
            r
            for r in run["records"]
            if (r["model"], r["ranks"], r["network"], r["network_model"], r["method"]) not in have
        ]
    return records


def write(results, out, path):
    """The figures into `out` (speedup, convergence, scaling) and the page at `path`."""
    speed_figure(figure_records(results), os.path.join(out, "e2e_speedup.png"))
    convergence_figure(results["convergence"], os.path.join(out, "convergence.png"))
    write_markdown(results, out, path)  # draws the scaling figure
