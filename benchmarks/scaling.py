"""Scaling past this machine: the step time the alpha-beta model of sparsecomm.core.cost
predicts for the e2e models at 2 to 1024 ranks, and how far that model is from the step
times measured here.

A predicted step is the floor (the same step with no gradient exchange) plus, for every
tensor of the model, what cost.costs says its exchange takes. Nothing here restates the
model's formulas: each rule (bytes, latency terms, local pack/unpack work) is cost.py's.

Inputs, all from recorded results (nothing is measured here):
  - the local work of the sparse path: a cost.LocalCost fitted to the kernel records
    (local_cost_from_kernels says which rows it takes);
  - the floor: the e2e "floor" row, or, in runs that have none, an estimate (floor_of);
  - the network: one NIC per rank at 1, 10 or 100 Gbit/s and LATENCY per message step.
"""

import functools
import math
import os
import re
import statistics
import textwrap

from sparsecomm.core import cost
from sparsecomm.core.plan import Policy, sparse_is_larger
from sparsecomm.core.selection import selected_count

from .e2e import layout_text
from .network import RATES as EMULATED_RATES

RANKS = tuple(2**i for i in range(1, 11))  # 2, 4, ..., 1024
RATES = {"1 Gbit/s": 1.25e8, "10 Gbit/s": 1.25e9, "100 Gbit/s": 1.25e10}  # bytes per second per rank
# 50 us per message step: a TCP round trip inside one cluster plus the collective library's
# own handling is tens of microseconds; kept the same at every rate (RDMA at 100 Gbit/s would
# be lower, which only helps the latency-bound rows).
LATENCY = 5e-5
DENSITY = 0.001  # DGC 0.1%, the e2e rows this model is checked against
ELEMENT_SIZE = VALUE_SIZE = 4  # float32 gradients, DGC sends float32 values
CHECKED_METHODS = {
    "dense": "dense",
    "DGC 0.1% allgather": "allgather",
    "DGC 0.1% spardl": "spardl",
    "DGC 0.1% hierarchical": "hierarchical",  # on hosts of several ranks only
}
CHECKED_RANKS = (2, 4)  # of one rank a host; every layout of several (2 x 2, 2 x 3) is checked
PER_HOST = 8  # GPUs a host in the hosts view
HOST_RANKS = tuple(n for n in RANKS if n >= PER_HOST)  # 8, 16, ..., 1024: whole hosts
HOST_EXCHANGES = (*cost.EXCHANGES, "hierarchical")
NAMES = {"dense": "dense", "allgather": "allgather", "spardl": "SparDL", "hierarchical": "hierarchical"}

# The parameters (name, shape) of benchmarks.e2e_worker.model_and_batch, written out so
# this module needs neither torch nor Horovod (tests compare the counts with the records).
MODELS = {
    "comm": (
        ("0.weight", (4096, 1024)),
        ("0.bias", (4096,)),
        ("2.weight", (4096, 4096)),
        ("2.bias", (4096,)),
        ("4.weight", (1024, 4096)),
        ("4.bias", (1024,)),
    ),
    "compute": (
        ("0.weight", (32, 3, 3, 3)),
        ("0.bias", (32,)),
        ("2.weight", (64, 32, 3, 3)),
        ("2.bias", (64,)),
        ("5.weight", (128, 64, 3, 3)),
        ("5.bias", (128,)),
        ("8.weight", (128, 128, 3, 3)),
        ("8.bias", (128,)),
        ("12.weight", (10, 128)),
        ("12.bias", (10,)),
    ),
}

# Kernel rows a compressor's path is made of, where a run has no "whole path" rows.
PACK_OPS = {
    "TopK": "pack_topk (exact top-k, EF)",
    "Threshold": "pack_sampled (estimate + pack + band)",
    "DGC": "pack_sampled (estimate + pack + band)",
}
UNPACK_OP = "sparse_unpack (k values, into a buffer)"


# -- the prediction ---------------------------------------------------------------------------


def _tensors(model_shapes, density, policy):
    """(numel, k, whether the compressor sends it dense) per tensor. model_shapes holds
    (name, shape) pairs or bare shapes. Dense: the per-layer policy (1-D, under min_numel,
    name patterns) or the dense fallback (k pairs no smaller than the tensor), as plan.py routes."""
    for i, item in enumerate(model_shapes):
        name, shape = item if isinstance(item[0], str) else (f"tensor{i}", item)
        numel = math.prod(shape)
        k = selected_count(density, numel)
        yield numel, k, policy.sends_dense(name, numel, len(shape)) or sparse_is_larger(k, numel, ELEMENT_SIZE)


def predict(model_shapes, ranks, network, local, floor_ms, density=DENSITY, policy=Policy()):
    """Predicted ms per step of the whole model under each exchange ("dense", "allgather",
    "spardl"): floor_ms + the sum over tensors of cost.costs. A tensor the compressor sends
    dense costs the dense term under every exchange. local: cost.LocalCost or None (cost.costs'
    copy estimate)."""
    costs = functools.partial(
        cost.costs, size=ELEMENT_SIZE, value_size=VALUE_SIZE, ranks=ranks, network=network, local=local
    )
    return _summed(model_shapes, cost.EXCHANGES, costs, floor_ms, density, policy)


def predict_hosts(model_shapes, hosts, per_host, network, local, floor_ms, density=DENSITY, policy=Policy()):
    """predict on `hosts` hosts of `per_host` ranks (cost.host_costs), "hierarchical" included;
    `network` is a host's NIC."""
    costs = functools.partial(
        cost.host_costs,
        size=ELEMENT_SIZE,
        value_size=VALUE_SIZE,
        hosts=hosts,
        per_host=per_host,
        network=network,
        local=local,
    )
    return _summed(model_shapes, HOST_EXCHANGES, costs, floor_ms, density, policy)


def _summed(model_shapes, exchanges, costs, floor_ms, density, policy):
    """floor_ms + the ms of each exchange summed over the tensors; costs(numel, k) -> seconds per
    exchange of one tensor. A tensor sent dense costs the dense term under every exchange."""
    seconds = dict.fromkeys(exchanges, 0.0)
    for numel, k, dense in _tensors(model_shapes, density, policy):
        each = costs(numel, k)
        for exchange in seconds:
            seconds[exchange] += each["dense" if dense else exchange]
    return {exchange: floor_ms + 1000 * s for exchange, s in seconds.items()}


def predicted_bytes(model_shapes, ranks, density=DENSITY, policy=Policy()):
    """Bytes one rank receives per step under each exchange (cost.received_bytes, summed)."""
    total = dict.fromkeys(cost.EXCHANGES, 0.0)
    for numel, k, dense in _tensors(model_shapes, density, policy):
        for exchange in total:
            total[exchange] += cost.received_bytes(
                "dense" if dense else exchange, numel, k, ELEMENT_SIZE, VALUE_SIZE, ranks
            )
    return total


# -- inputs from the records ------------------------------------------------------------------


def path_timings(kernel_records, method="DGC", density=DENSITY):
    """(LocalCost.fitted's inputs, a sentence saying where they come from), or (None, why).

    The path at two sizes (the smallest and largest recorded): the "<method> whole path
    (1 rank)" rows where the run has them (compress -> 1-rank Horovod allreduce -> decompress:
    the per-call term then also holds Horovod's own per-tensor cost); otherwise the sum of the
    method's pack row and the sparse_unpack row. The per-pair cost: the largest size's
    sparse_unpack row against its memcpy (no memset is recorded; a copy reads as well as
    writes, so it overstates the write pass and the per-pair cost comes out low, at worst 0)."""

    def ms(op, numel):
        return next(
            (
                r["median_ms"]
                for r in kernel_records
                if r["op"] == op and r["numel"] == numel and math.isclose(r["density"], density)
            ),
            None,
        )

    def sizes_with(*ops):
        return sorted({r["numel"] for r in kernel_records if all(ms(op, r["numel"]) is not None for op in ops)})

    whole, pack = f"{method} whole path (1 rank)", PACK_OPS.get(method)
    if len(sizes_with(whole)) >= 2:
        sizes, path, source = sizes_with(whole), (lambda n: ms(whole, n)), f"the '{whole}' kernel rows"
    elif pack and len(sizes_with(pack, UNPACK_OP)) >= 2:
        sizes, path = sizes_with(pack, UNPACK_OP), (lambda n: ms(pack, n) + ms(UNPACK_OP, n))
        source = f"'{pack}' + '{UNPACK_OP}' kernel rows (this run has no whole-path rows)"
    else:
        return None, f"no {method} kernel rows at density {density} (cost.costs' copy estimate instead)"
    small, large = sizes[0], sizes[-1]
    unpack = ms(UNPACK_OP, large)
    memcpy = next(r["memcpy_ms"] for r in kernel_records if r["numel"] == large)
    pairs = selected_count(density, large) if unpack is not None else 0
    timings = ((small, path(small) / 1000), (large, path(large) / 1000), (unpack or 0) / 1000, memcpy / 1000, pairs)
    return timings, f"{source} at {small:,} and {large:,} elements, density {density}"


def local_cost_from_kernels(kernel_records, method="DGC", density=DENSITY):
    """The cost.LocalCost of `method`'s sparse path fitted (LocalCost.fitted) to the kernel
    records, as path_timings describes; None where the records hold no such rows."""
    timings, _ = path_timings(kernel_records, method, density)
    return None if timings is None else cost.LocalCost.fitted(*timings)


def network_model_of(record):
    """Runs before the per-host network model existed all ran on the shared link."""
    return record.get("network_model", "shared")


def floor_of(e2e_records, model, ranks, network=None, network_model=None):
    """(floor ms, "measured" or "estimated"), or (None, "none").

    Measured: the median of the "floor" rows of (model, ranks[, network][, network model]).
    Estimated, in runs without floor rows: the fastest row of (model, ranks[, network model])
    on any network. Every row pays the floor, so up to noise this is an upper bound of it:
    predictions built on it come out high by that row's own exchange cost."""
    cell = [
        r
        for r in e2e_records
        if r["model"] == model and r["ranks"] == ranks and network_model in (None, network_model_of(r))
    ]
    floors = [r["step_ms"] for r in cell if r["method"] == "floor" and network in (None, r["network"])]
    if floors:
        return statistics.median(floors), "measured"
    if cell:
        return min(r["step_ms"] for r in cell), "estimated"
    return None, "none"


def emulated_network(rate_name, ranks, network_model, latency=LATENCY):
    """The cost.Network of an emulated e2e network. On the shared link (one shaped loopback)
    all ranks send at once through one link of that rate: each gets 1/ranks of it. Per host,
    each rank has its own NIC of that rate."""
    rate = EMULATED_RATES[rate_name]
    return cost.Network(bandwidth=rate / ranks if network_model == "shared" else rate, latency=latency)


# -- the projection ---------------------------------------------------------------------------


def table(
    kernel_records,
    e2e_records=(),
    models=("comm", "compute"),
    rank_counts=RANKS,
    rates=RATES,
    latency=LATENCY,
    density=DENSITY,
):
    """One row per (model, rate, ranks): the predicted ms of "dense", "allgather" and "spardl"
    (DGC's local cost from the kernel records), with the floor used and where it came from.
    The floor is the 2-rank one at every rank count: a fixed batch per rank (weak scaling),
    and 2 ranks on this 2-core machine is the closest it has to one host per rank."""
    local = local_cost_from_kernels(kernel_records, "DGC", density)
    rows = []
    for model in models:
        floor, source = floor_of(e2e_records, model, 2)
        if floor is None:  # no e2e rows at all: the exchange alone
            floor = 0.0
        for rate_name, rate in rates.items():
            network = cost.Network(bandwidth=rate, latency=latency)
            for ranks in rank_counts:
                predicted = predict(MODELS[model], ranks, network, local, floor, density)
                rows.append(
                    {
                        "model": model,
                        "network": rate_name,
                        "ranks": ranks,
                        "floor_ms": floor,
                        "floor": source,
                        **predicted,
                    }
                )
    return rows


def hosts_table(kernel_records, e2e_records=(), models=("comm", "compute"), rates=RATES, density=DENSITY):
    """table() for hosts of PER_HOST GPUs, one NIC each at `rates`: a row per (model, rate, GPUs)
    with the predicted ms of every exchange, "hierarchical" included."""
    local = local_cost_from_kernels(kernel_records, "DGC", density)
    rows = []
    for model in models:
        floor = floor_of(e2e_records, model, 2)[0] or 0.0
        for rate_name, rate in rates.items():
            network = cost.Network(bandwidth=rate, latency=LATENCY)
            for ranks in HOST_RANKS:
                predicted = predict_hosts(MODELS[model], ranks // PER_HOST, PER_HOST, network, local, floor, density)
                rows.append({"model": model, "network": rate_name, "ranks": ranks, "floor_ms": floor, **predicted})
    return rows


def beats_dense_markdown(rows):
    """Per model and rate, the GPU counts at which each sparse exchange is predicted faster than
    dense, as ranges ("8-512"; "-": none)."""
    body = []
    for model, rate in dict.fromkeys((r["model"], r["network"]) for r in rows):
        line = sorted((r for r in rows if (r["model"], r["network"]) == (model, rate)), key=lambda r: r["ranks"])
        cells = []
        for exchange in HOST_EXCHANGES[1:]:
            wins = [r[exchange] < r["dense"] for r in line]
            runs = [i for i, win in enumerate(wins) if win and (i == 0 or not wins[i - 1])]
            ranges = []
            for start in runs:
                end = next((i for i in range(start, len(line)) if not wins[i]), len(line)) - 1
                ranges.append(
                    f"{line[start]['ranks']}-{line[end]['ranks']}" if end > start else f"{line[start]['ranks']}"
                )
            cells.append(", ".join(ranges) or "-")
        body.append([model, rate, *cells])
    return _md(["model", "link", *(NAMES[e] for e in HOST_EXCHANGES[1:])], body)


def hosts_section(kernels, e2e):
    """The "### Hosts of 8 GPUs" part: at which GPU counts each exchange beats dense, and the comm
    model's steps at the most GPUs."""
    rows = hosts_table(kernels, e2e)
    top = [r for r in rows if r["model"] == "comm" and r["ranks"] == HOST_RANKS[-1]]
    steps = "; ".join(f"{r['network']}: " + ", ".join(f"{NAMES[e]} {r[e]:,.0f}" for e in HOST_EXCHANGES) for r in top)
    text = _para(
        f"Hosts of {PER_HOST} GPUs joined by a {cost.HOST_LINK.bandwidth / 1e9:.0f} GB/s link, one NIC each "
        f"(cost.host_costs: flat exchanges over every GPU; hierarchical inside each host, then across hosts). "
        f"The GPU counts, of {HOST_RANKS[0]} to {HOST_RANKS[-1]}, at which each exchange is predicted faster "
        f"than dense:"
    )
    last = _para(f"The comm model at {HOST_RANKS[-1]:,} GPUs, predicted ms/step: {steps}.")
    return f"""### Hosts of {PER_HOST} GPUs

{text}

{beats_dense_markdown(rows)}

{last}"""


def figure(path, rows):
    """Predicted ms/step vs ranks (log-log), one panel per model: a colour per exchange, a line
    style per network rate."""
    from .report import _plt

    plt = _plt()
    models = list(dict.fromkeys(r["model"] for r in rows))
    rates = list(dict.fromkeys(r["network"] for r in rows))
    styles = ("-", "--", ":", "-.")
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        for exchange, colour in zip(cost.EXCHANGES, ("black", "tab:orange", "tab:blue")):
            for rate, style in zip(rates, styles):
                line = [r for r in rows if (r["model"], r["network"]) == (model, rate)]
                ax.plot(
                    [r["ranks"] for r in line],
                    [r[exchange] for r in line],
                    style,
                    color=colour,
                    label=f"{'SparDL' if exchange == 'spardl' else exchange}, {rate}",
                )
        ax.axhline(next(r["floor_ms"] for r in rows if r["model"] == model), color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks (one NIC each)")
        ax.set_ylabel("predicted ms/step")
        ax.set_title(f"{model} model: floor (grey) + alpha-beta exchange, DGC 0.1%")
        ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the model against the measurements -------------------------------------------------------


def check(e2e_records, kernel_records, latency=LATENCY, density=DENSITY):
    """The model against the measured e2e rows on the shaped networks: dense, "DGC 0.1% allgather"
    and "DGC 0.1% spardl" on 2 and 4 ranks of one NIC each, and with "DGC 0.1% hierarchical" on
    hosts of several ranks (predict_hosts, the network a host's NIC). Returns {"rows": [...],
    "summary": {...}}; each row holds the measured and predicted ms and error = predicted /
    measured - 1."""
    local = local_cost_from_kernels(kernel_records, "DGC", density)
    rows = []
    for r in e2e_records:
        exchange, per_host = CHECKED_METHODS.get(r["method"]), r.get("ranks_per_host", 1)
        if (
            exchange is None
            or (per_host == 1 and (r["ranks"] not in CHECKED_RANKS or exchange == "hierarchical"))
            or r["network"] not in EMULATED_RATES
            or r["model"] not in MODELS
        ):
            continue
        network_model = network_model_of(r)
        floor, source = floor_of(e2e_records, r["model"], r["ranks"], r["network"], network_model)
        network = emulated_network(r["network"], r["ranks"], network_model, latency)
        if per_host == 1:
            predicted = predict(MODELS[r["model"]], r["ranks"], network, local, floor, density)[exchange]
        else:
            hosts = r["ranks"] // per_host
            predicted = predict_hosts(MODELS[r["model"]], hosts, per_host, network, local, floor, density)[exchange]
        rows.append(
            {
                "model": r["model"],
                "ranks": r["ranks"] if per_host == 1 else layout_text(r),
                "network": r["network"],
                "network_model": network_model,
                "ranks_per_host": per_host,
                "method": r["method"],
                "exchange": exchange,
                "floor_ms": floor,
                "floor": source,
                "measured_ms": r["step_ms"],
                "predicted_ms": predicted,
                "error": predicted / r["step_ms"] - 1,
            }
        )
    return {"rows": rows, "summary": summarize(rows)}


def check_with_added_hosts(results, kernels):
    """check over the run of record, and over the hosts' layouts of each run added to it
    (`bench report --add-e2e`: timed after a run of record that had none), each against the
    floor of its own run."""
    checked = check(results.get("e2e", []), kernels)
    rows = checked["rows"] + [
        row
        for run in results.get("e2e_added", [])
        for row in check(run["records"], kernels)["rows"]
        if row["ranks_per_host"] > 1
    ]
    return {"rows": rows, "summary": summarize(rows)}


def summarize(rows):
    """Median and max |error| over the rows, how many the model predicts below measurement,
    and the same per model."""

    def of(subset):
        errors = [abs(r["error"]) for r in subset]
        return {
            "count": len(subset),
            "median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None,
            "below": sum(r["error"] < 0 for r in subset),
        }

    summary = of(rows)
    summary["by_model"] = {m: of([r for r in rows if r["model"] == m]) for m in dict.fromkeys(r["model"] for r in rows)}
    summary["floors"] = sorted({r["floor"] for r in rows})
    return summary


# -- docs/results.md --------------------------------------------------------------------------


def _md(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def projection_rows(rows):
    """(header, rows) of the predicted ms/step, as scaling.csv: a row per rank count; per model and
    rate, dense / allgather / SparDL."""
    groups = list(dict.fromkeys((r["model"], r["network"]) for r in rows))
    header = ["ranks"] + [f"{model} {rate} {NAMES[e]}" for model, rate in groups for e in cost.EXCHANGES]
    by = {(r["model"], r["network"], r["ranks"]): r for r in rows}
    body = [
        [ranks] + [f"{by[model, rate, ranks][e]:,.0f}" for model, rate in groups for e in cost.EXCHANGES]
        for ranks in dict.fromkeys(r["ranks"] for r in rows)
    ]
    return header, body


def check_rows(checked):
    """(header, rows) of the model against the measured rows, as scaling_check.csv: a row per (model,
    link, method), per (ranks, network) the measured and predicted ms and the error."""
    rows = checked["rows"]
    cells = list(dict.fromkeys((r["ranks"], r["network"]) for r in rows))
    by = {(r["model"], r["network_model"], r["method"], r["ranks"], r["network"]): r for r in rows}
    header = ["model", "link", "method"] + [
        f"{ranks} ranks {net} {h}" for ranks, net in cells for h in ("measured", "predicted", "error")
    ]
    body = []
    for model, link, method in dict.fromkeys((r["model"], r["network_model"], r["method"]) for r in rows):
        row = [model, link, method]
        for ranks, net in cells:
            r = by.get((model, link, method, ranks, net))
            row += (
                ["", "", ""]
                if r is None
                else [f"{r['measured_ms']:.0f}", f"{r['predicted_ms']:.0f}", f"{100 * r['error']:+.0f}%"]
            )
        body.append(row)
    return header, body


def hosts_rows(rows):
    """(header, rows) of hosts_table: a row per (model, rate, GPUs), the predicted ms of each exchange."""
    header = ["model", "link", "GPUs", *(f"{NAMES[e]} ms/step" for e in HOST_EXCHANGES)]
    return header, [[r["model"], r["network"], r["ranks"], *(f"{r[e]:,.0f}" for e in HOST_EXCHANGES)] for r in rows]


def _error_sentence(summary):
    if not summary["count"]:
        return "No measured row to check the model against in this run (it needs 2- or 4-rank rows on 1gbit/10gbit)."
    parts = [
        f"{m} model {100 * s['median_abs_error']:.0f}% (max {100 * s['max_abs_error']:.0f}%)"
        for m, s in summary["by_model"].items()
    ]
    floors = " and ".join(summary["floors"])
    return (
        f"Against the {summary['count']} measured rows (ms/step), the prediction is off by a median of "
        f"{100 * summary['median_abs_error']:.0f}% and at most {100 * summary['max_abs_error']:.0f}%: "
        f"{', '.join(parts)}. It is below the measurement in {summary['below']} of them. Floors: {floors}."
    )


# A paragraph (or a "- " list item) of docs/results.md: its sentences on one line while they fit
# in this many characters, then on the next (the page is read rendered, in short paragraphs).
PARAGRAPH_WIDTH = 400
SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][)`\"])) (?=[A-Z`*\[(\"])")


def _para(text):
    indent = "  " if text.startswith("- ") else ""
    lines = []
    for sentence in SENTENCE_END.split(text):
        if lines and len(lines[-1]) + 1 + len(sentence) <= PARAGRAPH_WIDTH:
            lines[-1] += " " + sentence
            continue
        wrapped = textwrap.wrap(sentence, PARAGRAPH_WIDTH - len(indent), break_long_words=False, break_on_hyphens=False)
        lines += [line if not lines and i == 0 else indent + line for i, line in enumerate(wrapped)]
    return "\n".join(lines)


def assumptions(latency=LATENCY, top=RANKS[-1]):
    """What the model leaves out, in sentences, with the latency and the largest rank count used."""
    us, per_tensor = latency * 1e6, 2 * (top - 1) * latency
    counts = " and ".join(f"{len(shapes)} in the {model} model" for model, shapes in MODELS.items())
    return (
        "It leaves out, each making a real step slower or faster: this machine (the ranks share 2 cores; on the "
        "shared link the check divides the rate by the ranks), and Horovod's tensor fusion, overlap with the "
        f"backward pass and cycle (here each tensor pays its own latency). Ring latency, 2 (N-1) message steps of "
        f"{us:.0f} us for dense and SparDL, is {per_tensor:.2f} s per tensor at {top} ranks ({counts}): it bends "
        "every curve up, where tree allreduces pay far less. It takes the work as fixed: DGC at 0.1% from the "
        "first step, SparDL's full ceil(k/N) pairs, no stragglers, the 2-rank floor (a fixed batch per rank)."
    )


def parts(results, out_dir, link_dir="results"):
    """The markdown of the scaling results and of how they are computed, for docs/results.md,
    from a results dict (keys "kernels", "e2e"); writes the figure to out_dir/scaling.png.
    {"tables": "## Scaling past this machine": the projection and the check against the measured rows
    in a paragraph, the hosts of PER_HOST GPUs; "method": the model and what it leaves out;
    "csv": {file name: (header, rows)} of every model's projection, the check and the hosts'
    view, linked from the tables as link_dir/NAME}."""
    kernels, e2e = results.get("kernels", []), results.get("e2e", [])
    rows = table(kernels, e2e)
    figure(os.path.join(out_dir, "scaling.png"), rows)
    checked = check_with_added_hosts(results, kernels)
    _, local_source = path_timings(kernels, "DGC")
    floors = {m: next(r for r in rows if r["model"] == m) for m in MODELS}
    floor_text = ", ".join(
        f"{m} {r['floor_ms']:.0f} ms ({r['floor'] if r['floor'] != 'none' else 'no e2e rows'})"
        for m, r in floors.items()
    )
    intro = _para(
        f"The figure's predicted ms/step of DGC 0.1% at 2 to 1024 ranks, one NIC each, by the cost model "
        f"([how](#how-it-was-measured)); floor (2 ranks, no exchange): {floor_text}. Each model, rate and rank "
        f"count: [scaling.csv]({link_dir}/scaling.csv); for hosts of {PER_HOST} GPUs: "
        f"[scaling_hosts.csv]({link_dir}/scaling_hosts.csv). {_error_sentence(checked['summary'])} Each measured "
        f"row: [scaling_check.csv]({link_dir}/scaling_check.csv)."
    )
    tables = f"""## Scaling past this machine

{intro}

{hosts_section(kernels, e2e)}"""
    described = (
        f'The cost model of exchange="auto" (`sparsecomm/core/cost.py`, alpha-beta: '
        f"[exchanges.md](exchanges.md#the-cost-model-sparsecommcorecostpy)) gives the floor plus each tensor's "
        f"exchange cost. Each rank has a NIC of 1, 10 or 100 Gbit/s (1.25e8, 1.25e9, 1.25e10 bytes/s); a message "
        f"step takes {LATENCY * 1e6:.0f} us. Tensors sent dense by the per-layer policy cost the dense allreduce. "
        f"DGC's pack/unpack cost: {local_source}."
    )
    method = _para(f"- **The scaling model.** {described} {assumptions()}")
    csv = {
        "scaling.csv": projection_rows(rows),
        "scaling_check.csv": check_rows(checked),
        "scaling_hosts.csv": hosts_rows(hosts_table(kernels, e2e)),
    }
    return {"tables": tables, "method": method, "csv": csv}


def section(results, out_dir, link_dir="results"):
    """The whole "## Scaling past this machine" section: the tables, the figure (written to
    out_dir/scaling.png, linked as link_dir/scaling.png) and how it is computed."""
    text = parts(results, out_dir, link_dir)
    return f"{text['tables']}\n\n![scaling]({link_dir}/scaling.png)\n\n{text['method']}\n"
