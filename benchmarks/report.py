"""Figures (PNG), CSV tables and docs/results.md from the benchmark records.

`write` draws the figures, writes the wide tables as CSV files and the page from a results dict
(the run's results.json): `python -m benchmarks all` calls it after measuring, `python -m
benchmarks report` on a recorded run, measuring nothing. The page: a headline table (at most
HEADLINE_COLUMNS columns, one figure a cell), the figures, narrow tables and short sentences per
kind of result, how it was measured last; every column of the wide tables is in the CSV files
it links. It names no commit and no date: those live in results.json and the commit bodies."""

import csv
import os
import platform
import re
import shlex
import statistics

from . import first_steps, hook_step, scaling
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


# A commit as `git describe --always --dirty` names it (7 to 40 hex digits, a letter and a digit
# among them; after a tag, "-N-g"), and the phrases that name one in the records' texts.
COMMIT = r"(?:[\w.]+-\d+-g)?(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?:-dirty)?"
COMMIT_PHRASES = (
    (re.compile(rf" (?:on|code) (?:{COMMIT}|None)\b"), ""),  # "`python -m benchmarks all` on 219ef1c"
    (re.compile(rf" \({COMMIT}\)"), ""),  # 'for "DGC 0.1% Nesterov" (e2e0774)'
    (re.compile(rf"\({COMMIT}, "), "("),  # "(7b3152f, all three tasks)"
    (re.compile(rf", {COMMIT}\)"), ")"),
    (re.compile(rf"\b{COMMIT}\b"), "another commit"),  # any other
)


def without_commits(text):
    """A recorded text (where reused records were trained, which run timed a table) as the page
    shows it: without the commits it names. results.json keeps them."""
    for phrase, replacement in COMMIT_PHRASES:
        text = phrase.sub(replacement, text)
    return text


def convergence_source(earlier, path, key="convergence"):
    """Where reused convergence records (or those under `key`: "hsdp", "hsdp_convergence") were
    made: the run that made them, however many runs have reused them since (`earlier` is the
    results.json or the `bench ... --json` run read from `path`)."""
    if f"{key}_from" in earlier:  # itself a reuse: pass its source on
        return earlier[f"{key}_from"]
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


def with_hook_step_of(results, run, path):
    """`results` with the hook-step records of `run`, read from `path`: what `bench hook-step --json`
    writes or another run's results.json; hook_step_from names the run that timed them."""
    records = run["records"] if "records" in run else run["hook_step"]
    return dict(results, hook_step=records, hook_step_from=convergence_source(run, path, "hook_step"))


# What an added `bench hsdp` or `bench hsdp-convergence` run's record replaces: the records of its
# cell (a launch's rows share their floor and native HSDP), or of its task, layout and row.
HSDP_COVERS = {
    "hsdp": lambda r: (r["model"], r["network_model"], r["ranks"], r["network"]),
    "hsdp_convergence": lambda r: (r["task"], r["ranks"], r["method"]),
}


def with_hsdp_added(results, key, run, path):
    """`results` with the records under `key` ("hsdp", "hsdp_convergence") of `run`, read from
    `path`: what `bench hsdp --json` or `bench hsdp-convergence --json` writes, or another run's
    results.json. They replace the records of what they cover (HSDP_COVERS), the others kept before
    them; "<key>_from" names the run that made them, after the earlier source where any are kept."""
    records = run["records"] if "records" in run else run[key]
    covered = {HSDP_COVERS[key](r) for r in records}
    kept = [r for r in results.get(key) or [] if HSDP_COVERS[key](r) not in covered]
    source = convergence_source(run, path, key)
    if kept:
        earlier = results.get(f"{key}_from") or f"`{results.get('command')}` on {results.get('commit')}"
        source = f"{earlier}; {len(records)} rows by {source}"
    return dict(results, **{key: kept + records, f"{key}_from": source})


def _para(text):
    """A paragraph (or a "- " list item): one line, wrapped where longer than scaling.PARAGRAPH_WIDTH."""
    return scaling._para(text)


def _md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(path, header, rows):
    """A wide table as a CSV file (GitHub shows it as a table): its header, then its rows."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


# -- the records, in the page's order --------------------------------------------------------

NETWORK_ORDER = ("1gbit", "10gbit", "unshaped")
NETWORK_NAMES = {"1gbit": "1 Gbit/s", "10gbit": "10 Gbit/s"}
MODELS = {
    "comm": "an MLP 1024-4096-4096-1024, 25.2M parameters, 101 MB of gradient, batch 8",
    "comm-small": "an MLP 512-2048-2048-512, 6.3M parameters, 25 MB of gradient, batch 8",
    "compute": "a CNN on 32x32x3 images, 0.29M parameters, batch 32",
}
SHORT = {
    "comm": "an MLP with 101 MB of gradient",
    "comm-small": "an MLP with 25 MB of gradient",
    "compute": "a small CNN",
}
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
HEADLINE_COLUMNS = 8  # the headline table's most columns: one to read in 30 seconds


def _network_name(network):
    return NETWORK_NAMES.get(network, network)


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


def _flat(records):
    """The records of one rank a host (not those of a layout of hosts of several ranks)."""
    return [r for r in records if ranks_per_host(r["network_model"]) == 1]


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


def _metric(task, conv):
    return "accuracy" if any(r["task"] == task and r["metric"] == "accuracy" for r in conv) else "loss"


def _final_figure(record):
    """A convergence record's final value, one figure: 98.9% (accuracy) or 1.622 (a loss)."""
    if record is None:
        return "-"
    return f"{100 * record['final']:.1f}%" if record["metric"] == "accuracy" else f"{record['final']:.3f}"


def _record_of(conv, task, method):
    """The convergence record of `task` that an e2e row `method` trains as, or None."""
    trained = {(r["task"], r["method"]): r for r in conv}
    return trained.get((task, _trained_as(method, {m for t, m in trained if t == task}) or method))


# -- the headline ----------------------------------------------------------------------------


def _headline_cells(e2e):
    """(model, network model, ranks, networks, their records) of the headline: the comm model
    (else the first), per host (else the first network model of one rank a host), its most ranks,
    1 and 10 Gbit/s (else its first two networks)."""
    models = _ordered(r["model"] for r in e2e)
    model = "comm" if "comm" in models else next(iter(models), None)
    rows = _flat([r for r in e2e if r["model"] == model])
    netmodels = _ordered(r["network_model"] for r in rows)
    netmodel = "per-host" if "per-host" in netmodels else next(iter(netmodels), None)
    rows = [r for r in rows if r["network_model"] == netmodel]
    ranks = max((r["ranks"] for r in rows), default=None)
    rows = [r for r in rows if r["ranks"] == ranks]
    networks = [n for n in ("1gbit", "10gbit") if any(r["network"] == n for r in rows)] or _networks(rows)[:2]
    return model, netmodel, ranks, networks, rows


def _against(mine, theirs):
    """How many times faster `mine` steps than `theirs` (same cell), paired through the floor
    where both have vs_floor; None where either is missing."""
    if mine is None or theirs is None:
        return None
    if mine.get("vs_floor") and theirs.get("vs_floor"):
        return theirs["vs_floor"] / mine["vs_floor"]
    return theirs["step_ms"] / mine["step_ms"]


def _fastest_peer(rows, network):
    """The peer row (PEERS) of `rows` that steps fastest on `network`, or None."""
    peers = [r for r in rows if r["network"] == network and r["method"] in PEERS]
    paired = all(r.get("vs_floor") for r in peers)
    return min(peers, key=lambda r: r["vs_floor"] if paired else r["step_ms"], default=None)


def _headline(results):
    """(header, rows, the model, network model and ranks shown): per method (dense, then each of
    ours), one figure a cell: its speed against dense and against the fastest peer on each network
    shown, then its final accuracy or loss on each task that fits in HEADLINE_COLUMNS columns."""
    e2e, conv = results["e2e"], results["convergence"]
    model, netmodel, ranks, networks, rows = _headline_cells(e2e)
    peers = {n: _fastest_peer(rows, n) for n in networks}
    columns = [c for n in networks for c in [(n, None)] + ([(n, peers[n])] if peers[n] else [])]
    header = ["method"] + [
        f"{_network_name(n)} vs dense"
        if peer is None
        else f"{_network_name(n)} vs fastest peer ({PEERS[peer['method']]})"
        for n, peer in columns
    ]
    tasks = _ordered(r["task"] for r in conv)[: max(0, HEADLINE_COLUMNS - len(header))]
    header += [f"{t} {_metric(t, conv)}" for t in tasks]
    body = []
    for method in ["dense"] + _ordered(r["method"] for r in rows if r["family"] == "sparsecomm"):
        mine = {n: next((r for r in rows if r["network"] == n and r["method"] == method), None) for n in networks}
        speeds = [(mine[n] or {}).get("vs_dense") if peer is None else _against(mine[n], peer) for n, peer in columns]
        body.append([method, *map(_speed, speeds), *(_final_figure(_record_of(conv, t, method)) for t in tasks)])
    return header, body, (model, netmodel, ranks)


def _headline_notes(results, shown, rel):
    """How to read the headline table, and the other models' speeds in a sentence."""
    e2e, conv = results["e2e"], results["convergence"]
    model, netmodel, ranks = shown
    described = f"the {model} model ({SHORT[model]})" if model in SHORT else f"the {model} model"
    text = (
        f"How to read it: {ranks} ranks of {described}, one NIC each ({netmodel} network). A speed is how many "
        "times faster the method's step is than dense's (Horovod, float32) or than the fastest peer's on that "
        f"network (of {', '.join(_ordered(PEERS.values()))}), in the same run: above 1.0x the method is faster."
    )
    if conv:
        trained_ranks = " or ".join(_ordered(str(r.get("ranks", "?")) for r in conv))
        text += f" Accuracy and loss: the final value on {trained_ranks} ranks, the mean over the seeds."
    text += f" Every rank count, network and peer: [summary.csv]({rel}/summary.csv)."
    other = [r for r in e2e if r["model"] != model and r["family"] == "sparsecomm" and r["vs_dense"] is not None]
    if other:
        low, high = min(r["vs_dense"] for r in other), max(r["vs_dense"] for r in other)
        names = " and ".join(f"the {m} model" for m in _ordered(r["model"] for r in other))
        auto = [r for r in other if r["method"] == AUTO]
        dense = " `auto` sends it all dense." if auto and all(r["exchanges"] == ["dense"] for r in auto) else ""
        text += (
            f" On {names}, compute dominates: every method runs at {low:.2f}x to {high:.2f}x of dense's speed.{dense}"
        )
    return _para(text)


def _summary(results, rel):
    """The page's summary: the headline table and how to read it."""
    header, rows, shown = _headline(results)
    return f"{_md_table(header, rows)}\n\n{_headline_notes(results, shown, rel)}"


def _summary_wide(results):
    """(header, rows) of summary.csv: per method, its speed against dense and each peer in every
    cell of the headline's model and network model, then its accuracy with its range and change."""
    e2e, conv = results["e2e"], results["convergence"]
    model, netmodel = _headline_cells(e2e)[:2]
    rows = [r for r in e2e if r["model"] == model and r["network_model"] == netmodel]
    cells = [(n, net) for n in sorted({r["ranks"] for r in rows}) for net in _networks(rows)]
    peers = [p for p in PEERS if any(r["method"] == p for r in rows)]
    tasks = _ordered(r["task"] for r in conv)
    header = ["method"] + [
        f"{n} ranks {_network_name(net)} vs {PEERS.get(p, 'dense')}" for n, net in cells for p in [None, *peers]
    ]
    header += [f"{t} {_metric(t, conv)}" for t in tasks]
    body = []
    for method in ["dense"] + _ordered(r["method"] for r in rows if r["family"] == "sparsecomm"):
        row = [method]
        for n, net in cells:
            mine = _cell_of(rows, model, netmodel, n, net, method)
            row.append(ratio_text((mine or {}).get("vs_dense")))
            row += [ratio_text(_against(mine, _cell_of(rows, model, netmodel, n, net, p))) for p in peers]
        for task in tasks:
            record = _record_of(conv, task, method)
            row.append("-" if record is None else final_text(record, _record_of(conv, task, "dense")))
        body.append(row)
    return header, body


# -- end-to-end tables -----------------------------------------------------------------------

E2E_FIGURES = ("ms/step", "vs dense", "vs floor", "received MB", "exchange")  # a cell's, in e2e.csv


def _ranks_label(ranks, netmodel):
    """A cell's ranks: "4 ranks", or "2x2" on the network model of hosts of 2 ranks."""
    per_host = ranks_per_host(netmodel)
    return f"{ranks} ranks" if per_host == 1 else layout_label(ranks, per_host)


def _e2e_cells(records):
    """{(network model, ranks, network): its label, "4 ranks 1 Gbit/s" or "2x2 1 Gbit/s"}, one rank
    a host first, then by ranks and network; the network model joins a label where two would match."""
    keys = sorted(
        {(r["network_model"], r["ranks"], r["network"]) for r in records},
        key=lambda c: (ranks_per_host(c[0]), c[0], c[1], (NETWORK_ORDER + (c[2],)).index(c[2])),
    )
    labels = {c: f"{_ranks_label(c[1], c[0])} {_network_name(c[2])}" for c in keys}
    if len(set(labels.values())) < len(labels):  # several network models of one rank a host
        labels = {c: f"{label} ({c[0]})" for c, label in labels.items()}
    return labels


def _e2e_wide(records):
    """(header, rows) of e2e.csv and hosts.csv: a row per (model, method); per cell (network
    model, ranks, network) its ms/step, vs dense and vs floor with their 95% intervals, the MB a
    rank receives a step and the exchanges that sent it (E2E_FIGURES)."""
    cells = _e2e_cells(records)
    by = {(r["model"], r["network_model"], r["ranks"], r["network"], r["method"]): r for r in records}
    header = ["model", "method"] + [f"{label} {what}" for label in cells.values() for what in E2E_FIGURES]
    body = []
    for model, method in _ordered((r["model"], r["method"]) for r in records):
        row = [model, method]
        for cell in cells:
            c = by.get((model, *cell, method))
            row += (
                [""] * len(E2E_FIGURES)
                if c is None
                else [
                    f"{c['step_ms']:.1f}",
                    ratio_text(c.get("vs_dense"), c.get("vs_dense_interval")),
                    ratio_text(c.get("vs_floor"), c.get("vs_floor_interval")),
                    f"{c['received_bytes'] / 1e6:.3f}",
                    ", ".join(c["exchanges"]) or "-",
                ]
            )
        body.append(row)
    return header, body


def _step_table(records):
    """(header, rows) of one model's records, narrow: a row per method (not the `local` rows),
    its ms/step in each cell, then per ranks (or layout of hosts) the MB a rank receives a step
    on the first network."""
    cells = _e2e_cells(records)
    layouts = _ordered((netmodel, ranks) for netmodel, ranks, _ in cells)
    by = {(r["network_model"], r["ranks"], r["network"], r["method"]): r for r in records}
    header = ["method", *cells.values(), *(f"{_ranks_label(n, m)} MB" for m, n in layouts)]
    body = []
    for method in _ordered(r["method"] for r in records if r["family"] != "local"):
        row = [method] + [f"{by[(*c, method)]['step_ms']:.1f}" if (*c, method) in by else "-" for c in cells]
        for layout in layouts:
            first = next((by[(*c, method)] for c in cells if c[:2] == layout and (*c, method) in by), None)
            row.append("-" if first is None else f"{first['received_bytes'] / 1e6:.3f}")
        body.append(row)
    return header, body


CELL_HEADER = ("method", "ms/step", "vs dense", "vs floor", "received MB", "exchange")


def _cell_tables(records):
    """Per cell (model, network model, ranks, network): its title and a narrow table, a row per
    method and one figure a column (CELL_HEADER); the intervals are in the CSV files."""
    blocks = []
    for key in _ordered((r["model"], r["network_model"], r["ranks"], r["network"]) for r in records):
        model, netmodel, ranks, net = key
        mine = [r for r in records if (r["model"], r["network_model"], r["ranks"], r["network"]) == key]
        rows = [
            (
                r["method"],
                f"{r['step_ms']:.1f}",
                ratio_text(r.get("vs_dense")),
                ratio_text(r.get("vs_floor")),
                f"{r['received_bytes'] / 1e6:.3f}",
                ", ".join(r["exchanges"]) or "-",
            )
            for r in mine
        ]
        title = f"**{model} model, {_ranks_label(ranks, netmodel)}, {_network_name(net)} ({netmodel})**"
        blocks.append(f"{title}\n\n{_md_table(CELL_HEADER, rows)}")
    return "\n\n".join(blocks)


def _e2e_section(results, rel):
    """The page's end-to-end section: the headline model's ms/step per cell, its hosts of several
    ranks, auto against its routes alone, Horovod or DDP, and where a step's time goes."""
    e2e = results["e2e"]
    model = _headline_cells(e2e)[0]
    mine = [r for r in e2e if r["model"] == model]
    flat, hosts = _flat(mine), [r for r in mine if ranks_per_host(r["network_model"]) > 1]
    netmodels = " and ".join(_ordered(r["network_model"] for r in flat))
    first = _network_name(next(iter(_networks(flat)), "-"))
    parts = [
        _para(
            f"The {model} model's ms/step (the median over the timed steps of the slowest rank) in each cell of "
            f"ranks and network, on the {netmodels} network; MB: what a rank receives a step, at {first}. Ratios "
            f"with their 95% intervals, the exchanges, the `local` rows and every model: [e2e.csv]({rel}/e2e.csv)."
        ),
        _md_table(*_step_table(flat)),
    ]
    if hosts:
        parts.append(
            _para(
                f"**Hosts of several ranks** ({model} model): 2x2 is 2 hosts of 2 ranks, one NIC a host; ms/step "
                f"and MB as above. Ratios with their intervals: [hosts.csv]({rel}/hosts.csv)."
            )
        )
        parts.append(_md_table(*_step_table(hosts)))
    parts += [_hsdp_block(results, rel), _auto_block(e2e, rel), _ways_block(e2e, rel), _phase_text(e2e, rel)]
    return "\n\n".join(part for part in parts if part)


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


def _auto_block(e2e, rel=None, table=True):
    """exchange="auto" against the fastest of its routes alone: how many cells meet each verdict,
    each cell where it is slower by more than 3%, what its route trial kept, and (`table`) a narrow
    table: a row per model and ranks, a column per network, auto's step against that route's
    (bold: slower by more than 3%); every column of _auto_rows in auto.csv (`rel`: the folder of
    the CSV files, relative to the page; None: no link). "" where the records have no auto row."""
    rows = [(r, *_against_fastest(r, e2e)) for r in e2e if r["method"] == AUTO and r["vs_dense"] is not None]
    if not rows:
        return ""
    verdicts = [_verdict(speedup, interval) for _, _, speedup, interval in rows]
    slower = [
        f"{r['model']} {_ranks_label(r['ranks'], r['network_model'])} {_network_name(r['network'])} "
        f"{speedup:.2f}x of {fastest}"
        for (r, fastest, speedup, _), verdict in zip(rows, verdicts)
        if verdict == VERDICTS[2]
    ]
    kept = [(r.get("route_trial") or {}).get("kept") for r, *_ in rows]
    trial = ", ".join(
        f"{KEPT.get(k, k)} in {kept.count(k)} cell{'' if kept.count(k) == 1 else 's'}"
        for k in _ordered(filter(None, kept))
    )
    link = f" With the intervals, the trial's steps and the compress hooks: [auto.csv]({rel}/auto.csv)." if rel else ""
    said = _para(
        f'**exchange="auto"** (DGC 0.1%) against the fastest of the rows of its cell that send every tensor one '
        f"way (dense, allgather, SparDL, hierarchical), its step over auto's: within 3% or faster (0.97x or more) "
        f"in {verdicts.count(VERDICTS[0])} of {len(rows)} cells; slower at the median but not told apart (its "
        f"interval reaches the margin) in {verdicts.count(VERDICTS[1])}; slower by more than 3% (bold) in "
        f"{len(slower)}"
        + (f" ({'; '.join(slower)})" if slower else "")
        + "."
        + (f" Its route trial kept {trial}." if trial else "")
        + link
    )
    if not table:
        return said
    networks = _networks([r for r, *_ in rows])
    by = {(r["model"], r["network_model"], r["ranks"], r["network"]): (s, v) for (r, _, s, _), v in zip(rows, verdicts)}
    body = []
    for model, netmodel, ranks in _ordered((r["model"], r["network_model"], r["ranks"]) for r, *_ in rows):
        cells = [by.get((model, netmodel, ranks, n)) for n in networks]
        shown = ["-" if c is None else f"**{c[0]:.2f}x**" if c[1] == VERDICTS[2] else f"{c[0]:.2f}x" for c in cells]
        body.append([model, layout_label(ranks, ranks_per_host(netmodel)), *shown])
    return f"{said}\n\n{_md_table(['model', 'ranks', *map(_network_name, networks)], body)}"


KEPT = {"model": "the model's routes"}  # what a route trial kept, as the page says it


def _phase_rows(e2e):
    """(header, rows) of phases.csv: a row per comm-model cell (ranks, network); per method shown
    (the floor, the synced floor, each local row and its method) the ms of each phase where they
    were timed, then each method with a local row over that row (its kernels alone: what its
    exchange adds). Cells with neither are left out."""
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
    header = ["ranks", "network", *(f"{m} {p}" for m in methods for p in PHASES)]
    header += [f"{m} over kernels alone" for m in locals_of]
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


def _phase_text(e2e, rel):
    """A paragraph on where a step's time goes: each method over its kernels alone, from its
    lowest to its highest cell; every phase of every cell in phases.csv."""
    if not _phase_rows(e2e)[1]:
        return ""
    over = {}
    for _, _, _, cell in _cells(e2e):
        for r in cell:
            if r.get("vs_local") is not None:
                over.setdefault(r["method"], []).append(r["vs_local"])
    said = "; ".join(f"{m} {_span(values, '.2f')}x" for m, values in over.items())
    return _para(
        f"**Where a step's time goes** (comm model): the ms of each phase, on the slowest rank, of the floor, "
        f"each `local` row and its method: [phases.csv]({rel}/phases.csv)."
        + (
            f" Each method over its kernels alone (its `local` row), which is what its exchange adds: {said}."
            if said
            else ""
        )
    )


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
        parts.append(f"the {model} model's rows were timed {' or '.join(how)}")
    said = "; ".join(parts)
    return f"{said[:1].upper()}{said[1:]}." if said else ""


# -- the same compressor, two ways in: Horovod and DDP's hook -------------------------------

WAYS_HEADER = (
    "ranks",
    "network",
    "method",
    "Horovod ms/step",
    "Horovod vs floor",
    "DDP hook ms/step",
    "DDP hook vs floor",
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


def _ways_block(records, rel=None):
    """Horovod or DDP: what the table of _ways_rows says (_ways_text), the table itself in
    ways.csv (`rel`: the folder of the CSV files, relative to the page; None: no link)."""
    if not _ways_rows(records):
        return ""
    link = f" Each pair, with the MB and the phases of each way: [ways.csv]({rel}/ways.csv)." if rel else ""
    said = _para(
        "**Horovod or DDP** (comm model): each method through Horovod and as DDP's communication hook, in the "
        f"same run; DDP hook / Horovod below 1.00x: the hook is faster.{link}"
    )
    return f"{said}\n\n{_ways_text(records)}"


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


def _run_name(run):
    return f"`{relative_command(run['command'])}`" if run.get("command") else "A run"


def _added_block(results, rel=None):
    """Each added run: what ran it, a narrow table a cell, its auto and its Horovod or DDP
    paragraphs; its wide table in added.csv (`rel`: the folder of the CSV files; None: no link)."""
    blocks = []
    for run in results.get("e2e_added", []):
        minutes = f", {run['minutes']:.0f} minutes" if run.get("minutes") is not None else ""
        said = _para(f"{_run_name(run)}{minutes}: its ratios are against its own floor and dense.")
        records = run["records"]
        parts = (said, _cell_tables(records), _auto_block(records, table=False), _ways_block(records))
        blocks.append("\n\n".join(part for part in parts if part))
    if not blocks:
        return ""
    link = f" With their intervals: [added.csv]({rel}/added.csv)." if rel else ""
    intro = _para(
        "Rows timed after the run of record, in runs of their own (added by `python -m benchmarks "
        f"report --add-e2e`), on the same machine kind.{link}"
    )
    return "### Runs added to the record\n\n" + intro + "\n\n" + "\n\n".join(blocks)


def _added_wide(results):
    """(header, rows) of added.csv: each added run's e2e.csv rows after its number and command."""
    tables = [(i, run, *_e2e_wide(run["records"])) for i, run in enumerate(results.get("e2e_added", []), 1)]
    header = ["run", "command"] + _ordered(h for *_, columns, _ in tables for h in columns)
    rows = [
        [i, relative_command(run["command"]) if run.get("command") else "-"]
        + [dict(zip(columns, row)).get(h, "") for h in header[2:]]
        for i, run, columns, body in tables
        for row in body
    ]
    return header, rows


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
        f'DGC 0.1% with exchange="auto" and with each exchange alone, from a freshly built compressor, {launches} '
        "launches a cell averaged step by step: the mean of the first 30 and 100 steps (slowest rank), the steady "
        "step, and the first 30 steps' mean over the fastest fixed exchange's (auto's aim: within "
        f"{first_steps.WITHIN:.2f}x)." + (f" Timed by {without_commits(source)}." if source else "")
    )
    return f"## First steps of exchange=auto\n\n{intro}\n\n{_md_table(FIRST_STEPS_HEADER, rows)}\n\n"


# -- compressed HSDP (FSDP2) on hosts of several ranks -----------------------------------------

HSDP_NATIVE = "native HSDP"  # the baseline of benchmarks.hsdp and benchmarks.hsdp_convergence
HSDP_HEADER = (
    "model",
    "layout",
    "network",
    "network model",
    "row",
    "ms/step",
    "vs native",
    "vs floor",
    "host MB",
    "NIC MB",
    "link ms",
    "floor + link ms",
)
HSDP_CONVERGENCE_HEADER = ("task", "layout", "row", "epochs", "final", "each seed", "vs native", "bytes vs native")


def _mb(value):
    return "-" if value is None else f"{value / 1e6:.3f}"


def _hsdp_rows(hsdp):
    """HSDP_HEADER's rows (hsdp.csv): a record each, its ratios with their 95% intervals, the MB a
    host's ranks send the other hosts a step (counted, and its NIC's measured), their time at the
    link's rate and the floor plus that time."""
    return [
        (
            r["model"],
            layout_label(r["ranks"], r.get("ranks_per_host", 1)),
            r["network"],
            r["network_model"],
            r["method"],
            f"{r['step_ms']:.1f}",
            ratio_text(r.get("vs_native"), r.get("vs_native_interval")),
            ratio_text(r.get("vs_floor"), r.get("vs_floor_interval")),
            _mb(r["host_sent_bytes"]),
            _mb(r.get("nic_sent_bytes")),
            "-" if r.get("link_ms") is None else f"{r['link_ms']:.1f}",
            "-" if r.get("modelled_ms") is None else f"{r['modelled_ms']:.1f}",
        )
        for r in hsdp
    ]


def _hsdp_convergence_rows(conv):
    """HSDP_CONVERGENCE_HEADER's rows (hsdp_convergence.csv): a row each, its final value with the
    range over the seeds, each seed's, the change against native HSDP's and the bytes native HSDP
    sends per step over the compressor's (its stats(); native: 1x)."""
    native = {r["task"]: r for r in conv if r["method"] == HSDP_NATIVE}
    rows = []
    for r in conv:
        seeds = r.get("seeds") or [r.get("seed")]
        each = ", ".join(
            f"{s}: {_final_figure(dict(r, final=f))}" for s, f in zip(seeds, r.get("finals") or [r["final"]])
        )
        stats = r.get("stats") or {}
        saved = f"{stats['dense_bytes'] / max(stats['sent_bytes'], 1):.0f}x" if stats else "1x"
        base = native.get(r["task"])
        layout = layout_label(r["ranks"], r["ranks"] // r.get("replicas", 1))
        change = "-" if base is None else change_text(r, base)
        rows.append((r["task"], layout, r["method"], r.get("epochs", "-"), final_value_text(r), each, change, saved))
    return rows


def _hsdp_table(hsdp, conv):
    """(header, rows) of the page's HSDP table: a row per HSDP row (the floor, native HSDP, each
    compressor), for the first layout its ms/step, vs native and vs floor at 1 and 10 Gbit/s (else
    its first two networks) and the MB a host sends a step, then its final value on the first task
    trained (the mean over the seeds) and the change against native HSDP's."""
    layout = next(((r["network_model"], r["ranks"]) for r in hsdp), None)
    hsdp = [r for r in hsdp if (r["network_model"], r["ranks"]) == layout]
    networks = [n for n in ("1gbit", "10gbit") if any(r["network"] == n for r in hsdp)] or _networks(hsdp)[:2]
    by = {(r["network"], r["method"]): r for r in hsdp}
    task = next((r["task"] for r in conv), None)
    trained = {r["method"]: r for r in conv if r["task"] == task}
    header = ["row"] + [f"{_network_name(n)} {what}" for n in networks for what in ("ms/step", "vs native", "vs floor")]
    header += (["host MB"] if hsdp else []) + ([f"{task} {_metric(task, conv)}", "vs native"] if conv else [])
    body = []
    for method in _ordered(r["method"] for r in hsdp + conv):
        row = [method]
        for r in (by.get((n, method)) for n in networks):
            row += (
                ["-"] * 3
                if r is None
                else [f"{r['step_ms']:.1f}", ratio_text(r["vs_native"]), ratio_text(r["vs_floor"])]
            )
        if hsdp:
            row.append(_mb(next((by[n, method]["host_sent_bytes"] for n in networks if (n, method) in by), None)))
        if conv:
            r, native = trained.get(method), trained.get(HSDP_NATIVE)
            row += [_final_figure(r), "-" if r is None or native is None else change_text(r, native)]
        body.append(row)
    return header, body


def _hsdp_block(results, rel):
    """Compressed HSDP beside the rows above: what ran, how to read _hsdp_table, the runs that timed
    and trained its rows where others than the page's did, the table; every record in hsdp.csv and
    hsdp_convergence.csv. "" where the results have neither."""
    hsdp, conv = results.get("hsdp") or [], results.get("hsdp_convergence") or []
    if not hsdp and not conv:
        return ""
    said = (
        "**Compressed HSDP** ([fsdp.md](fsdp.md)): FSDP2 shards the model over the ranks of each host and "
        "exchanges its gradient shards across the hosts itself (native HSDP, dense float32) or through "
        "`register_fsdp_hook` with the compressor and settings of its `DDP +` row above."
    )
    if hsdp:
        first, per_host = hsdp[0], hsdp[0].get("ranks_per_host", 1)
        netmodel = first["network_model"].partition(",")[0]
        links = "one NIC a host" if netmodel == "per-host" else "one shaped link for all"
        said += (
            f" Steps: the {first['model']} model on {first['ranks'] // per_host} hosts of {per_host} ranks, {links} "
            f"({netmodel} network); vs native: native HSDP's step over the "
            "row's (above 1.00x: faster); vs floor: the row's over the floor's (no exchange across the hosts); "
            "host MB: what a host sends the others a step."
        )
    if conv:
        seeds = sorted({s for r in conv for s in (r.get("seeds") or [r.get("seed")])})
        replicas = conv[0].get("replicas", 1)
        said += (
            f" Accuracy: the {conv[0]['task']} task on {replicas} replicas of {conv[0]['ranks'] // replicas} ranks, "
            f"the mean over seeds {', '.join(map(str, seeds))}; vs native: the change."
        )
    for verb, key in (("Timed", "hsdp_from"), ("Trained", "hsdp_convergence_from")):
        said += f" {verb} by {without_commits(results[key])}." if key in results else ""
    files = [f"[{name}.csv]({rel}/{name}.csv)" for name, rows in (("hsdp", hsdp), ("hsdp_convergence", conv)) if rows]
    said += f" With the intervals, the NICs' bytes and each seed: {', '.join(files)}."
    return f"{_para(said)}\n\n{_md_table(*_hsdp_table(hsdp, conv))}"


# -- convergence and kernels -----------------------------------------------------------------


def _convergence_rows(conv, wide=True):
    """(header, rows): a row per method, per task its final value (the mean over the seeds; `wide`:
    and their range), the change against dense and the bytes dense sends per step over the
    method's. `wide`: every column named in full, as convergence.csv's."""
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
            shown = final_value_text(r) if wide else _final_figure(r)
            row += [shown, "-" if dense is None else change_text(r, dense), f"{saved:.0f}x"]
        rows.append(row)
    named = (lambda t, h: f"{t} {h}") if wide else (lambda t, h: h)
    header = ["method"] + [
        h for t in tasks for h in (f"{t} {_metric(t, conv)}", named(t, "vs dense"), named(t, "bytes/step vs dense"))
    ]
    return header, rows


def _data_text(conv):
    """Which data each task's records were trained on, in one line (the worker records it: the
    stdlib corpus changes between Python releases); then a warning a task trained on several."""
    said, warnings = [], []
    for task in dict.fromkeys(r["task"] for r in conv):
        kinds = []
        for r in conv:
            if r["task"] == task and r.get("data") not in kinds:
                kinds.append(r.get("data"))
        unknown = "not recorded by the run that trained it"
        said += [f"{task}: " + (f"{d['source']}, sha256 {d['sha256'][:16]}" if d else unknown) for d in kinds]
        if len(kinds) > 1:
            warnings.append(f"- **{task}'s methods were not all trained on the same data**: compare them with care.")
    return "\n".join(["- Data: " + "; ".join(said) + ".", *warnings]) if said else ""


def _reused(results):
    """Where the convergence records were trained, where another run trained them: that run's
    command (and any other runs' whose records were added), without their commits."""
    if "convergence_from" not in results:
        return ""
    return (
        f"These convergence records were trained by another run ({without_commits(results['convergence_from'])}), "
        "not by this one."
    )


def _convergence_section(results, rel):
    conv = results["convergence"]
    said = (
        "The final test accuracy or validation loss, the mean over the seeds (a loss is better when lower); vs "
        "dense: the change; bytes: dense's per step over the method's. With the ranges: "
        f"[convergence.csv]({rel}/convergence.csv)."
    )
    parts = [_para(_reused(results)) if "convergence_from" in results else "", _para(said)]
    parts += [_md_table(*_convergence_rows(conv, wide=False)), _data_text(conv)]
    return "## Convergence on real data\n\n" + "\n\n".join(part for part in parts if part)


def _kernel_groups(kernels):
    """The (numel, density) of the kernel runs, and the one the page sets beside memcpy and
    torch.topk: the most elements at the lowest density."""
    groups = _ordered((k["numel"], k["density"]) for k in kernels)
    return groups, max(groups, key=lambda g: (g[0], -g[1]), default=None)


def _whole_path(op):
    """Whether a kernel row times a whole path (compress, allreduce, decompress), not one kernel."""
    return "whole path" in op or "no compression" in op


def _kernel_rows(kernels, wide=True):
    """(header, rows): a row per kernel (not `wide`: per whole path, where the run has them); per
    (numel, density) its median ms, then (`wide`: per (numel, density) too, as kernels.csv's; else
    for _kernel_groups' one) that over a memcpy of the same numel, and torch.topk's time over it."""
    groups, key = _kernel_groups(kernels)
    by = {(k["op"], k["numel"], k["density"]): k for k in kernels}

    def label(group):
        return f"{group[0]:,} at {group[1]:g}"

    def ratios(k):
        return (
            ["-", "-"]
            if k is None
            else [f"{k['median_ms'] / k['memcpy_ms']:.2f}", f"{k['topk_ms'] / k['median_ms']:.2f}"]
        )

    header, rows = ["kernel"], []
    for g in groups:
        header += [f"{label(g)}: ms"] + ([f"{label(g)}: / memcpy", f"{label(g)}: topk / this"] if wide else [])
    if not wide and key is not None:
        header += [f"{label(key)}: / memcpy", f"{label(key)}: topk / this"]
    ops = _ordered(k["op"] for k in kernels)
    for op in ops if wide else [op for op in ops if _whole_path(op)] or ops:
        row = [op]
        for g in groups:
            k = by.get((op, *g))
            row += ["-" if k is None else f"{k['median_ms']:.3f}"] + (ratios(k) if wide else [])
        rows.append(row + ([] if wide or key is None else ratios(by.get((op, *key)))))
    return header, rows


def _model_rows_text(kernels):
    """What a model's rows are, where the run has them (`bench kernels --kernel-models`)."""
    if not any("tensors" in k for k in kernels):
        return ""
    return (
        " A \"ResNet-50's 161 tensors\" row runs it on ResNet-50's gradients, 25.6M elements in tensors of "
        "64 to 2.4M (1-D ones and those under 1,024 elements dense), one torch.topk per tensor."
    )


def _kernel_section(kernels, rel):
    groups, key = _kernel_groups(kernels)
    if key is None:
        return ""
    said = _para(
        "Each whole path's median ms per size and density (compress, Horovod's allreduce, decompress); at "
        f"{key[0]:,} elements and density {key[1]:g}, that over a memcpy of the same numel and torch.topk's time "
        f"over it. Every kernel alone, both ratios at every size: [kernels.csv]({rel}/kernels.csv)."
    )
    return f"## Kernels\n\n{said}\n\n{_md_table(*_kernel_rows(kernels, wide=False))}"


def _hook_step_text(results, rel):
    """The DDP hook's own cost (benchmarks/hook_step.py), and which run timed it where not this one."""
    source = results.get("hook_step_from")
    return hook_step.text(results.get("hook_step") or [], rel, source and without_commits(source))


# -- how it was measured ---------------------------------------------------------------------

NETWORK_MODELS = {
    "per-host": "Each rank has a network namespace and a veth pair to a bridge, both ends shaped by `tc ... tbf`: "
    "one full-duplex NIC a host on a non-blocking switch (unshaped: no tbf)",
    "shared": "The ranks of one `horovodrun --gloo` run share one namespace whose loopback `tc ... tbf` shapes: "
    "ONE link for all, like a small cluster behind one switch port (unshaped: plain loopback)",
}
HOSTS_OF = (
    "A namespace a host, its ranks talking over its own unshaped loopback, one shaped veth pair a host: hosts of "
    "several GPUs with one NIC each (the model's check takes the link inside a host as `cost.HOST_LINK`)"
)


def _network_model_text(name):
    """What a network model of the records is: NETWORK_MODELS' own, or hosts of several ranks."""
    base, _, hosts = name.partition(HOSTS_SUFFIX)  # "2", or "several ranks" for a run's models
    return NETWORK_MODELS[base] if not hosts else HOSTS_OF


RATIOS = (
    "- **Ratios.** vs dense: dense's ms/step over the row's (above 1.00x: faster than dense); vs floor: the "
    "row's over the floor's (1.00x: the exchange costs nothing); over kernels alone: the row's vs floor over its "
    "`local` row's; received MB: what one rank receives a step (dense: 2 (N-1)/N of the gradient)."
)
ROWS = (
    "- **Rows.** `floor`: the step with no exchange, which none can beat; `floor synced` adds a 1-element "
    "allreduce, so the ranks wait for each other once a step as every exchanging row must. Peers: Horovod's fp16 "
    "compression (`dense fp16`) and PyTorch DDP on gloo with `gradient_as_bucket_view=True`: `DDP dense`, `DDP "
    "fp16` (`fp16_compress_hook`), `DDP PowerSGD` (`powerSGD_hook`, rank 4, error feedback, warm start, one "
    "bucket). `DDP + DGC 0.1%` and the like: DDP (default buckets) with our compressor as its hook "
    "(`sparsecomm.torch.ddp_hook`), the settings and optimizer of its Horovod row; its MB count each gathered "
    "parameter at its padded capacity. A `local` row runs its method's compressor on each rank alone: every "
    "kernel, nothing sent. All step SGD with momentum 0.9, except DGC (its own) and RandomBlock (plain SGD)."
)
PHASES_TEXT = (
    "- **Phases.** forward: zero_grad and forward; backward: Horovod's hooks compress and start the exchanges; "
    'step: Horovod waits, decompresses, and the optimizer steps. **exchange="auto"** meets its aim at 0.97x or '
    "more of the fastest of its routes alone, paired through dense turn by turn ([route trial](exchanges.md#"
    "overlap-with-the-backward-pass))."
)
NOISE_TEXT = (
    "- **Noise.** The ranks share this machine's cores: 4-rank and compute-model rows carry noise of tens of "
    "percent. Off 1 Gbit/s, dense fp16 is slow on CPU (software half precision)."
)


def _training_text(conv):
    """How the convergence records trained: the shared schedule where the records carry it."""
    if not conv or any("schedule" not in r for r in conv):  # records of a run before the shared schedule
        return "Every method trains on 2 ranks, same seeds, data order and epochs."
    seeds = sorted({s for r in conv for s in (r.get("seeds") or [r.get("seed", 0)])})
    tasks = {r["task"]: r["schedule"] for r in conv}
    each = "; ".join(
        f"{task} {c['lr']} after {c['warmup_epochs']} epoch{'' if c['warmup_epochs'] == 1 else 's'}, "
        + (f"the averaged gradient clipped to norm {c['clip_norm']}" if c["clip_norm"] else "no clipping")
        for task, c in tasks.items()
    )
    return (
        f"Every method trains on 2 ranks on the same schedule, once per seed ({', '.join(map(str, seeds))}: "
        f"initial weights and data order). The learning rate after its linear warm-up, and the clipping: {each}. "
        "DGC's density warm-up runs over the same steps, and DGC clips locally at the norm / sqrt(N) (its paper's "
        "rule). RandomBlock steps plain SGD: with momentum it diverges ([random_block.md](random_block.md))."
    )


def _dense_flat_text(conv):
    """Where dense ends on each task: its last epochs, to show the runs are long enough."""

    def shown(record):
        last, epochs = record["curve"][-3:], len(record["curve"])
        values = ", ".join(f"{v:.1%}" if record["metric"] == "accuracy" else f"{v:.3f}" for v in last)
        return f"{record['task']} {values} (epochs {epochs - 2}-{epochs})"

    ends = [shown(r) for r in conv if r["method"] == "dense" and len(r["curve"]) >= 3]
    return f" Dense has flattened by the end: {'; '.join(ends)}." if ends else ""


TASKS_TEXT = (
    " digits: a small CNN, 1,437 training / 360 held-out images. charlm: a GRU (64-dim embedding, 192 hidden) on "
    "the Python standard library's sources (600 kB, last 10% held out). wordlm: a GRU (64-dim embedding, 128 "
    "hidden, the 5,000 most frequent words) on the first 250k words of the Wikipedia sample gensim's wheel ships "
    "for its tests, as gensim's parser reads it (last 10% held out)."
)
KERNELS_TEXT = (
    "- **Kernels** are timed in turn with a float32 memcpy of the same numel and torch.topk(x.abs(), k) "
    '([kernels.md](kernels.md#measured-speed-cpu)). A "whole path (1 rank)" row is compress, Horovod\'s '
    'allreduce and decompress; a "TF" row the same in a tf.function.'
)


def _method_section(results, scaling_method):
    """How it was measured: the run, the network models and models, the timing, the rows, the
    convergence and kernel runs, and the scaling model (`scaling_method`)."""
    e2e, conv = results["e2e"], results["convergence"]
    added = [r for run in results.get("e2e_added", []) for r in run["records"]]
    netmodels = sorted(
        {re.sub(rf"{HOSTS_SUFFIX}\d+", f"{HOSTS_SUFFIX}several ranks", r["network_model"]) for r in e2e + added}
    )
    models = "; ".join(f"{m}: {MODELS[m]}" for m in _ordered(r["model"] for r in e2e) if m in MODELS)
    ran = _para(
        f"`make bench` ran `{relative_command(results['command'])}` for {results['minutes']:.0f} minutes; "
        "`python -m benchmarks report` renders this page, its figures and its CSV files from results.json."
    )
    items = [
        *(f"- **Network model: {m}.** {_network_model_text(m)}." for m in netmodels),
        f"- **Models.** {models}." if models else "",
        f"- **Turns.** {_timing(e2e)} Each turn starts one row further on, so drift falls on all rows alike. A "
        "ratio is the median of the rows' step ratios in the same turns, with a 95% interval (one row at a "
        "time: of medians).",
        RATIOS,
        ROWS,
        PHASES_TEXT,
        NOISE_TEXT,
        f"- **Convergence.** {_training_text(conv)}{_dense_flat_text(conv)}",
        f"- **Tasks.**{TASKS_TEXT}",
        KERNELS_TEXT + _model_rows_text(results["kernels"]),
    ]
    listed = "\n".join(_para(item) for item in items if item)
    return f"## How it was measured\n\n{ran}\n\n{listed}\n{scaling_method}"


# -- the page and its CSV files --------------------------------------------------------------


def write_tables(results, out, more=None):
    """The wide tables as CSV files in `out` (and `more`: {file name: (header, rows)}); a table
    without rows writes no file and removes an earlier one. Returns the names written."""
    e2e = results["e2e"]
    tables = {
        "summary.csv": _summary_wide(results),
        "e2e.csv": _e2e_wide(_flat(e2e)),
        "hosts.csv": _e2e_wide([r for r in e2e if ranks_per_host(r["network_model"]) > 1]),
        "auto.csv": (AUTO_HEADER, _auto_rows(e2e)),
        "phases.csv": _phase_rows(e2e),
        "ways.csv": (WAYS_HEADER, _ways_rows(e2e)),
        "added.csv": _added_wide(results),
        "convergence.csv": _convergence_rows(results["convergence"]),
        "kernels.csv": _kernel_rows(results["kernels"]),
        "hook_step.csv": hook_step.csv_rows(results.get("hook_step") or []),
        "hsdp.csv": (HSDP_HEADER, _hsdp_rows(results.get("hsdp") or [])),
        "hsdp_convergence.csv": (
            HSDP_CONVERGENCE_HEADER,
            _hsdp_convergence_rows(results.get("hsdp_convergence") or []),
        ),
        **(more or {}),
    }
    written = []
    for name, (header, rows) in tables.items():
        path = os.path.join(out, name)
        if rows:
            write_csv(path, header, rows)
            written.append(name)
        elif os.path.exists(path):
            os.remove(path)
    return written


def _top(results, rel):
    return _para(
        f"`make bench` on {results['machine']}. Every ratio is against a baseline of the same run. Records: "
        f"[{rel}/results.json]({rel}/results.json); every column of each table below, with the 95% intervals, is "
        "in the CSV file it links (GitHub shows one as a table)."
    )


def write_markdown(results, out, path):
    """docs/results.md: the headline, the figures, narrow tables of this run, how it was measured;
    the wide tables as CSV files beside the figures. `out`: the folder of the figures, CSV files and
    results.json; links on the page are relative to it."""
    rel = os.path.relpath(out, os.path.dirname(os.path.abspath(path)) or ".")
    scaled = scaling.parts(results, out, rel)
    write_tables(results, out, scaled["csv"])
    figures = "\n".join(f"![{name}]({rel}/{file}.png)" for name, file in FIGURES)
    sections = [
        "# Results",
        _top(results, rel),
        "## Summary",
        _summary(results, rel),
        "## Figures",
        figures,
        "## End-to-end step time on an emulated network",
        _e2e_section(results, rel),
        _added_block(results, rel),
        _first_steps_block(results.get("trial"), results.get("trial_from")).strip("\n"),
        _convergence_section(results, rel),
        _kernel_section(results["kernels"], rel),
        _hook_step_text(results, rel),
        scaled["tables"],
        _method_section(results, scaled["method"]),
    ]
    with open(path, "w") as f:
        f.write("\n\n".join(part for part in sections if part).rstrip("\n") + "\n")


FIGURES = (("speedup", "e2e_speedup"), ("convergence", "convergence"), ("scaling", "scaling"))


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
    """The figures into `out` (speedup, convergence, scaling), the CSV files and the page at `path`."""
    speed_figure(figure_records(results), os.path.join(out, "e2e_speedup.png"))
    convergence_figure(results["convergence"], os.path.join(out, "convergence.png"))
    write_markdown(results, out, path)  # draws the scaling figure, writes the CSV files
