"""Figures (PNG) and docs/results.md from the benchmark records."""
import os
import platform

from . import scaling
from .e2e import PHASES, ratio_text


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
            values = [next((r["speedup_vs_dense"] or 0 for r in records
                            if (r["model"], r["ranks"], r["network_model"], r["network"], r["method"]) ==
                            (model, ranks, netmodel, net, m)), 0) for m in methods]
            ax.bar([i + j * width for i in range(len(methods))], values, width, label=net)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + width * (len(networks) - 1) / 2 for i in range(len(methods))])
        ax.set_xticklabels(methods, rotation=60, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"{model} model, {ranks} ranks, {netmodel} network")
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
            ax.plot(range(1, len(r["curve"]) + 1), r["curve"], label=r["method"],
                    linewidth=2.2 if r["method"] == "dense" else 1.2)
        ax.set_xlabel("epoch")
        ax.set_ylabel("test accuracy" if task == "digits" else "validation loss (nats/char)")
        ax.set_title({"digits": "CNN on digits", "charlm": "char GRU on stdlib sources"}.get(task, task))
        if task == "digits":
            ax.set_ylim(0.8, 1.0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine():
    import torch
    cores = os.cpu_count()
    return (f"{platform.machine()} Linux, {cores} CPU cores, Python {platform.python_version()}, "
            f"torch {torch.__version__}, Horovod 0.28.1 (Gloo)")


def code_version():
    """The commit of the code being measured (with -dirty for uncommitted changes), or None
    outside a git checkout."""
    import subprocess
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    return out.stdout.strip()


def convergence_source(earlier, path):
    """Where reused convergence records were trained: the run that trained them, however many
    runs have reused them since (`earlier` is the results.json read from `path`)."""
    if "convergence_from" in earlier:  # itself a reuse: pass its source on
        return earlier["convergence_from"]
    command = f"`{earlier['command']}`" if "command" in earlier else path
    return f"{command} on {earlier['commit']}" if earlier.get("commit") else command


def _md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


NETWORK_MODELS = {
    "per-host": """**Per-host NICs.** Each rank runs in a network namespace of its own, joined to a bridge by a
veth pair whose two ends are shaped with `tc ... tbf` (the rank's end: what it sends; the
bridge's end: what it receives): every rank has its own full-duplex link of that rate, like
hosts with one NIC each on a non-blocking switch. The ranks are started one per namespace with
the Gloo environment `horovodrun` gives them. Unshaped: the same veths and bridge without tbf.""",
    "shared": """**One shared link.** The ranks of one `horovodrun --gloo` run inside one network namespace
whose loopback is shaped with `tc ... tbf`: they share ONE link of that rate (the aggregate of a
small cluster behind one switch port, not one NIC per host). Unshaped: plain loopback.""",
}
FLOOR_AND_PEERS = """**Floor and peers.** `floor` is the same training step with no gradient exchange at all:
each rank steps (SGD, momentum 0.9) on its own gradient. No exchange can beat it; `vs floor` is
this row's step time / the floor's (1.00x: the exchange costs nothing). `floor synced` is the
floor with one 1-element allreduce before the optimizer's step: no gradient is exchanged, but the
ranks wait for each other once a step, as every exchanging row must. Where the ranks' backward
passes differ from step to step (a busy machine), the slower one then sets the step, while the
floor pays only the slower rank's whole step: its vs floor is what that wait costs any
synchronous method here, before a byte of gradient is sent. Every Horovod row steps
SGD with momentum 0.9 too, except DGC (its momentum correction is in the compressor) and
RandomBlock (plain SGD: with momentum it diverges, random_block.md); those two skip the
optimizer's momentum pass over the parameters, which the floor makes. The peers are PyTorch
DistributedDataParallel on the gloo backend, run in the same worker and network as the Horovod
rows (torch.distributed beside Horovod, over the same interface), SGD with momentum 0.9:
`DDP dense` (default buckets), `DDP fp16` (`fp16_compress_hook`) and `DDP PowerSGD`
(`powerSGD_hook`, rank 4, error feedback and warm start; one bucket, as Gloo aborts with several;
its first 2 iterations are plain allreduce, so its warm-up is at least 2 steps and every timed
step compresses). Their received bytes are the ring's 2 (N-1)/N of what they send (PowerSGD: its
P and Q factors and the tensors it leaves uncompressed, as PowerSGD counts them).

**The floor plus the kernels.** A `local` row runs the compressor and optimizer of the row it is
named after (`Threshold 1% local`: `Threshold 1%`'s) on a Horovod process set of each rank alone:
every kernel of compress and decompress and Horovod's cycle run, and nothing is sent (received:
0). No exchange of that method can beat it: its vs floor is what the kernels cost, and the
method's own row over it is what the exchange adds."""


AUTO = "DGC 0.1% auto"
WITHIN = 0.97  # exchange="auto" is to be within 3% of dense's step time, or faster


def _auto_summary(e2e):
    """Per cell: how exchange="auto" (DGC 0.1%) compares with dense, and whether that meets
    "within 3% of dense or faster" given the interval of the paired ratio."""
    lines = []
    for r in e2e:
        if r["method"] != AUTO or r["vs_dense"] is None:
            continue
        interval = r.get("vs_dense_interval")
        if r["vs_dense"] >= WITHIN:
            verdict = "within 3% of dense or faster"
        elif interval is not None and interval[1] >= WITHIN:
            verdict = "slower at the median, but its interval reaches the 3% margin: not told apart from it"
        else:
            verdict = "**slower than dense by more than 3%**"
        trial = r.get("route_trial")
        tried = "" if trial is None else " (its route trial, ms a step: " + ", ".join(
            f"{side} {ms:.0f}" for side, ms in trial["step_ms"].items()) + (
            f"; median pair {trial['ratio']:.2f} over {trial['steps']} steps" if "ratio" in trial else "") + (
            f"; kept {trial['kept']})")
        hooks = "" if "compress_ms" not in r else (
            f"; its compress hooks took {r['compress_ms']:.2f} ms a step, {r['compress_ms'] / r['step_ms']:.1%} of it")
        lines.append(f"- {r['model']} model, {r['ranks']} ranks, {r['network']} ({r['network_model']}): "
                     f"{ratio_text(r['vs_dense'], interval)} of dense's speed, sent by "
                     f"{', '.join(r['exchanges']) or '-'}{tried}{hooks}: {verdict}.")
    return "\n".join(lines)


def _cells(e2e):
    """(network model, ranks, network, its records) of the comm-model runs, in a stable order."""
    order = {"1gbit": 0, "10gbit": 1, "unshaped": 2}
    keys = sorted({(r["network_model"], r["ranks"], r["network"]) for r in e2e if r["model"] == "comm"},
                  key=lambda c: (c[0], c[1], order.get(c[2], 3)))
    for netmodel, ranks, net in keys:
        yield netmodel, ranks, net, [r for r in e2e if (r["model"], r["network_model"], r["ranks"], r["network"]) ==
                                     ("comm", netmodel, ranks, net)]


def _speedup_summary(e2e):
    lines = []
    for netmodel, ranks, net, cell in _cells(e2e):
        dgc = [r["speedup_vs_dense"] for r in cell if r["method"].startswith("DGC")]
        drop = [r["speedup_vs_dense"] for r in cell if r["method"].startswith("Threshold 1%")]
        if dgc and drop and None not in dgc + drop:
            lines.append(f"- comm model, {ranks} ranks, {net} ({netmodel}): DGC {min(dgc):.1f}x to {max(dgc):.1f}x, "
                         f"gradient dropping (Threshold 1%, with and without 2-bit) {min(drop):.1f}x to "
                         f"{max(drop):.1f}x faster than dense.")
    return "\n".join(lines)


def _floor_summary(e2e):
    """Per comm-model cell: the floor, and how far dense, the peers and the best method are from it."""
    lines = []
    for netmodel, ranks, net, cell in _cells(e2e):
        floor = next((r for r in cell if r["method"] == "floor"), None)
        if floor is None:
            continue
        parts = [f"{r['method']} {r['vs_floor']:.1f}x" for r in cell
                 if r["family"] in ("horovod", "ddp") or r["method"] == "floor synced"]
        ours = [r for r in cell if r["family"] == "sparsecomm"]
        if ours:
            best = min(ours, key=lambda r: r["step_ms"])
            parts.append(f"the fastest sparsecomm row ({best['method']}) {best['vs_floor']:.1f}x")
        lines.append(f"- comm model, {ranks} ranks, {net} ({netmodel}): floor {floor['step_ms']:.0f} ms/step; "
                     f"{', '.join(parts)} the floor's step time.")
    return "\n".join(lines)


def _vs_floor(record):
    return ratio_text(record["vs_floor"], record.get("vs_floor_interval"))


def _local_summary(e2e):
    """Per cell with local rows: each method's vs floor beside its local row's (its kernels alone),
    and, where measured, the method over its local row (what its exchange adds)."""
    lines = []
    for netmodel, ranks, net, rows in _cells(e2e):
        cell = {r["method"]: r for r in rows}
        parts = []
        for local in cell.values():
            method = cell.get(local.get("local_of")) if local["family"] == "local" else None
            if method is None:
                continue
            part = f"{local['local_of']} {_vs_floor(method)}, its kernels alone {_vs_floor(local)}"
            if method.get("vs_local") is not None:
                over = ratio_text(method["vs_local"], method.get("vs_local_interval"))
                part += f", the method over its kernels alone {over}"
            parts.append(part)
        if parts:
            lines.append(f"- comm model, {ranks} ranks, {net} ({netmodel}), vs floor: {'; '.join(parts)}.")
    return "\n".join(lines)


def _local_block(e2e):
    lines = _local_summary(e2e)
    return f"{lines}\n\n" if lines else ""


def _phase_rows(e2e):
    """(ranks, network, method, forward, backward, step, ms/step) of the floor (and the synced
    floor), each local row and its method in the comm-model cells, where the phases were timed."""
    rows = []
    for _, ranks, net, cell in _cells(e2e):
        by = {r["method"]: r for r in cell if "phases_ms" in r}
        shown = ["floor", "floor synced"] + [m for r in by.values() if r["family"] == "local"
                                             for m in (r["method"], r["local_of"])]
        for method in dict.fromkeys(m for m in shown if m in by):
            phases = by[method]["phases_ms"]
            rows.append((ranks, net, method, *(f"{phases[p]:.1f}" for p in PHASES),
                         f"{by[method]['step_ms']:.1f}"))
    return rows


def _phase_block(e2e):
    rows = _phase_rows(e2e)
    if not rows:
        return ""
    table = _md_table(("ranks", "network", "method", *PHASES, "ms/step"), rows)
    return f"""**Where a step's time goes** (comm model; ms, each phase's median over the timed steps on its
slowest rank, so the phases need not add up to ms/step). forward: zero_grad and the forward
pass. backward: the backward pass, in which Horovod's hooks call compress, so the kernels of a
`local` row's compress show here, and start the exchanges. step: the optimizer's step, in
which Horovod waits for the exchanges and calls decompress before stepping the parameters: the
exchange's wait shows here, as the method's step over its local row's. Rows timed in different
groups (see above) ran minutes apart, on a machine whose speed drifts by tens of percent: compare
their phases with care; the ratios above pair each row with its own group's floor.

{table}

"""


def _auto_block(e2e):
    lines = _auto_summary(e2e)
    if not lines:
        return ""
    return f"""**exchange="auto" against dense** (DGC 0.1%; vs dense above 1.00x is faster than dense):

{lines}

"""


def _e2e_tables(e2e):
    """One table per network model, each under the description of its model."""
    header = ("model", "ranks", "network", "method", "ms/step", "vs dense", "vs floor", "received MB", "exchange")
    blocks = []
    for netmodel in sorted({r["network_model"] for r in e2e}):
        rows = [(r["model"], r["ranks"], r["network"], r["method"], f"{r['step_ms']:.1f}",
                 ratio_text(r["vs_dense"], r.get("vs_dense_interval")), ratio_text(r["vs_floor"], r.get("vs_floor_interval")),
                 f"{r['received_bytes'] / 1e6:.3f}", ", ".join(r["exchanges"]))
                for r in e2e if r["network_model"] == netmodel]
        blocks.append(f"### Network model: {netmodel}\n\n{NETWORK_MODELS[netmodel]}\n\n{_md_table(header, rows)}")
    return "\n\n".join(blocks)


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
                together = (f"in groups of {listed} rows, as many as fit in memory together on that many ranks, "
                            f"each group holding the floor and dense (timed again with every group), built first")
            how.append(f"in {n} interleaved turns ({together}, then each row timed in turn for 1/{n} of its "
                       f"steps, each turn starting one row further on, so the machine's drift, which here moves a "
                       f"step's time by tens of percent within seconds, falls on all rows alike; their vs dense "
                       f"and vs floor pair the steps of the same turn)")
        parts.append(f"The {model} model's rows were timed {' or '.join(how)}.")
    return " ".join(parts)


def _e2e_section(e2e, rel):
    networks = ", ".join(sorted({r["network"] for r in e2e}))
    models = ", ".join(sorted({r["network_model"] for r in e2e}))
    return f"""## End-to-end step time on an emulated network

Ranks on an emulated network shaped with `tc ... tbf` to 1 or 10 Gbit/s, or unshaped (networks
in this run: {networks}; network model: {models}, described above each table). All ranks share
this machine's CPU cores. Step time: a step lasts as long as its slowest rank; ms/step is the
median of that over the timed steps after warm-up. {_timing(e2e)} vs dense: dense allreduce step
time / this row's (the speedup), same model, ranks and network. vs floor: this row's step time /
the floor's. Rows timed in turns are compared step by step: the ratio is the median, over the
turns, of the ratio of the two rows' steps in the same turn (seconds apart), so it may differ
from the ratio of the ms/step column. In brackets: the 95% interval of that median (from the
order statistics of the paired ratios: no assumption on how the noise is distributed). Rows
timed one at a time: the ratio of their medians, no interval. Received: bytes per rank per
step, counted by sparsecomm (dense: the ring's 2 (N-1)/N of the gradient).

- comm model: MLP 1024-4096-4096-1024, 25.2M parameters (101 MB of gradient), batch 8.
- compute model: a CNN on 32x32x3, 0.29M parameters, batch 32.

![speedup]({rel}/e2e_speedup.png)

{_speedup_summary(e2e)}

{FLOOR_AND_PEERS}

{_floor_summary(e2e)}

{_local_block(e2e)}{_phase_block(e2e)}{_auto_block(e2e)}Reading these numbers:

- **Noise.** This machine has 2 cores. 2 ranks get one core each. 4 ranks oversubscribe them,
  so the 4-rank rows, and every compute-model row, carry scheduling noise of tens of percent.
- **Same exchange, different times.** The three DGC rows differ only in their exchange. Where
  auto chose the same exchange as another row, the gap between the two is that noise (and, for
  rows timed one at a time, the order the methods ran in), not a property of "auto". Auto's
  choice itself rests on a network measured at its first step, so a run on a busy machine may
  choose differently from the next one (every rank of a run still chooses alike).
- **fp16 on CPU.** The dense fp16 row is often slower than float32 off the 1 Gbit/s link:
  Horovod casts and sums in software half precision on CPU.
- **Under the floor.** A row faster than the floor (vs floor under 1.00x) is that noise too,
  or, for DGC and RandomBlock, the optimizer's momentum pass they skip (above). The compute
  model's rows sit close to its floor.

{_e2e_tables(e2e)}

"""


def _convergence_rows(conv):
    dense = {r["task"]: r["final"] for r in conv if r["method"] == "dense"}
    rows = []
    for r in conv:
        base = dense.get(r["task"])
        if r["metric"] == "accuracy":
            final, delta = f"{100 * r['final']:.1f}%", f"{100 * (r['final'] - base):+.1f} pt"
        else:
            final, delta = f"{r['final']:.3f}", f"{100 * (r['final'] / base - 1):+.1f}%"
        rows.append((r["task"], r["method"], final, delta,
                     f"{r['dense_bytes_per_step'] / max(r['sent_bytes_per_step'], 1):.0f}x"))
    return rows


def _model_rows_text(kernels):
    """What a model's rows are, where the run has them (`bench kernels --kernel-models`)."""
    if not any("tensors" in k for k in kernels):
        return ""
    return """ The rows of "ResNet-50's 161 tensors" run that path on each
of ResNet-50's gradients (the same 25.6M elements in tensors of 64 to 2.4M; 1-D ones and those
under 1,024 elements dense, the default policy), beside Horovod with no compression on them:
what each tensor costs besides its elements shows there. Their torch.topk is one per tensor."""


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
            lines.append(f"- {task} data: " + (f"{d['source']}, sha256 {d['sha256'][:16]}." if d else
                                               "not recorded by the run that trained these records."))
        if len(kinds) > 1:
            lines.append(f"- **{task}'s methods were not all trained on the same data**: compare them with care.")
    return "\n".join(lines)


def _of_code(results):
    return f", code {results['commit']}" if results.get("commit") else ""


def _reused(results):
    if "convergence_from" not in results:
        return ""
    return (f"\nThese convergence records were trained by another run ({results['convergence_from']}), "
            f"not by this one: training was not repeated.\n")


def write_markdown(results, out, path):
    """docs/results.md: the machine, the command, the tables and the figures of this run."""
    rel = os.path.relpath(out, os.path.dirname(os.path.abspath(path)) or ".")
    conv_rows = _convergence_rows(results["convergence"])
    kernel_rows = [(k["op"], f"{k['numel']:,}", k["density"], f"{k['median_ms']:.3f}",
                    f"{k['median_ms'] / k['memcpy_ms']:.2f}", f"{k['topk_ms'] / k['median_ms']:.2f}")
                   for k in results["kernels"]]
    text = f"""# Results

Generated by `make bench` (`{results['command']}`{_of_code(results)}) in {results['minutes']:.0f} minutes on: {results['machine']}.
Raw records: [{rel}/results.json]({rel}/results.json). Every ratio is against the baseline
measured in the same run.

{_e2e_section(results["e2e"], rel)}## Convergence on real data
{_reused(results)}
2 ranks, same seeds, data order and epochs for every method. Dense and most methods use SGD
with momentum 0.9; DGC carries its own momentum (0.9) and uses plain SGD; RandomBlock uses
plain SGD (with optimizer momentum it diverges, random_block.md).

- digits: a small CNN on scikit-learn's digits, 1,437 training / 360 held-out images.
- charlm: a character-level GRU (64-dim embedding, 192 hidden) on the Python standard
  library's sources (600 kB; the last 10% held out); loss in nats per character.

{_data_text(results["convergence"])}

![convergence]({rel}/convergence.png)

{_md_table(("task", "method", "final", "vs dense", "bytes/step vs dense"), conv_rows)}

## Kernels

Ratios against a float32 memcpy of the same numel, and torch.topk(x.abs(), k), in the same run.

{_md_table(("kernel", "numel", "density", "median ms", "time / memcpy", "torch.topk time / this"), kernel_rows)}

A "whole path (1 rank)" row is a compressor as hvd.DistributedOptimizer runs it: compress ->
Horovod's allreduce of what it hands over -> decompress, on one rank (its exchange's
collectives on one rank included). A "TF ..." row is the TensorFlow compressor's, through
horovod.tensorflow's allreduce in a tf.function (timed in a process of its own, on the same
gradient, each call in turn with the same memcpy).{_model_rows_text(results["kernels"])}

{scaling.section(results, out, rel)}
"""
    with open(path, "w") as f:
        f.write(text)
