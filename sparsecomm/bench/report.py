"""Figures (PNG) and docs/results.md from the benchmark records."""
import os
import platform


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def speed_figure(records, path):
    """Speedup vs dense per method, one panel per (model, ranks), one bar group per network."""
    plt = _plt()
    panels = sorted({(r["model"], r["ranks"]) for r in records})
    networks = [n for n in ("1gbit", "10gbit", "unshaped") if any(r["network"] == n for r in records)]
    methods = list(dict.fromkeys(r["method"] for r in records))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    width = 0.8 / max(1, len(networks))
    for ax, (model, ranks) in zip(axes[0], panels):
        for j, net in enumerate(networks):
            values = [next((r["speedup_vs_dense"] for r in records if (r["model"], r["ranks"], r["network"],
                                                                        r["method"]) == (model, ranks, net, m)), 0)
                      for m in methods]
            ax.bar([i + j * width for i in range(len(methods))], values, width, label=net)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + width * (len(networks) - 1) / 2 for i in range(len(methods))])
        ax.set_xticklabels(methods, rotation=60, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"{model} model, {ranks} ranks")
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


def _md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_markdown(results, out, path):
    """docs/results.md: the machine, the command, the tables and the figures of this run."""
    e2e, conv = results["e2e"], results["convergence"]
    rel = os.path.relpath(out, os.path.dirname(os.path.abspath(path)) or ".")
    e2e_rows = [(r["model"], r["ranks"], r["network"], r["method"], f"{r['step_ms']:.1f}",
                 f"{r['speedup_vs_dense']:.2f}x", f"{r['received_bytes'] / 1e6:.3f}", ", ".join(r["exchanges"]))
                for r in e2e]
    dense = {r["task"]: r["final"] for r in conv if r["method"] == "dense"}
    conv_rows = []
    for r in conv:
        base = dense.get(r["task"])
        if r["metric"] == "accuracy":
            final, delta = f"{100 * r['final']:.1f}%", f"{100 * (r['final'] - base):+.1f} pt"
        else:
            final, delta = f"{r['final']:.3f}", f"{100 * (r['final'] / base - 1):+.1f}%"
        conv_rows.append((r["task"], r["method"], final, delta,
                          f"{r['dense_bytes_per_step'] / max(r['sent_bytes_per_step'], 1):.0f}x"))
    kernel_rows = [(k["op"], f"{k['numel']:,}", k["density"], f"{k['median_ms']:.3f}",
                    f"{k['median_ms'] / k['memcpy_ms']:.2f}", f"{k['topk_ms'] / k['median_ms']:.2f}")
                   for k in results["kernels"]]
    shaped = sorted({r["network"] for r in e2e})

    def speedups(model, ranks, net, prefix):
        return [r["speedup_vs_dense"] for r in e2e if (r["model"], r["ranks"], r["network"]) == (model, ranks, net)
                and r["method"].startswith(prefix)]

    summary = []
    for ranks in sorted({r["ranks"] for r in e2e}):
        for net in ("1gbit", "10gbit", "unshaped"):
            dgc, drop = speedups("comm", ranks, net, "DGC"), speedups("comm", ranks, net, "Threshold 1%")
            if dgc and drop:
                summary.append(f"- comm model, {ranks} ranks, {net}: DGC {min(dgc):.1f}x to {max(dgc):.1f}x, "
                               f"gradient dropping (Threshold 1%, with and without 2-bit) {min(drop):.1f}x to "
                               f"{max(drop):.1f}x faster than dense.")
    summary = "\n".join(summary)
    text = f"""# Results

Generated by `make bench` (`{results['command']}`) in {results['minutes']:.0f} minutes on: {results['machine']}.
Raw records: [{rel}/results.json]({rel}/results.json). Every ratio is against the baseline
measured in the same run.

## End-to-end step time on an emulated network

Ranks of one `horovodrun --gloo` inside a network namespace whose loopback is shaped with
`tc ... tbf` to 1 or 10 Gbit/s, or on unshaped loopback (networks in this run: {", ".join(shaped)}).
All ranks share that ONE link (the aggregate of a small cluster behind one switch port, not
one NIC per host), and all ranks share this machine's CPU cores. Step time: the slowest
rank's median over the timed steps after warm-up. Speedup: dense allreduce step time / this
method's, same model, ranks and network. Received: bytes per rank per step, counted by
sparsecomm (dense: the ring's 2 (N-1)/N of the gradient).

- comm model: MLP 1024-4096-4096-1024, 25.2M parameters (101 MB of gradient), batch 8.
- compute model: a CNN on 32x32x3, 0.29M parameters, batch 32.

![speedup]({rel}/e2e_speedup.png)

{summary}

Reading these numbers:

- **Noise.** This machine has 2 cores. 2 ranks get one core each. 4 ranks oversubscribe them,
  so the 4-rank rows, and every compute-model row, carry scheduling noise of tens of percent.
- **Same exchange, different times.** The three DGC rows differ only in their exchange. Where
  auto chose the same exchange as another row, the gap between the two is that noise (and the
  order the methods ran in), not a property of "auto".
- **fp16 on CPU.** The dense fp16 row is often slower than float32 off the 1 Gbit/s link:
  Horovod casts and sums in software half precision on CPU.

{_md_table(("model", "ranks", "network", "method", "ms/step", "speedup", "received MB", "exchange"), e2e_rows)}

## Convergence on real data

2 ranks, same seeds, data order and epochs for every method. Dense and most methods use SGD
with momentum 0.9; DGC carries its own momentum (0.9) and uses plain SGD; RandomBlock uses
plain SGD (with optimizer momentum it diverges, random_block.md).

- digits: a small CNN on scikit-learn's digits, 1,437 training / 360 held-out images.
- charlm: a character-level GRU (64-dim embedding, 192 hidden) on the Python standard
  library's sources (600 kB; the last 10% held out); loss in nats per character.

![convergence]({rel}/convergence.png)

{_md_table(("task", "method", "final", "vs dense", "bytes/step vs dense"), conv_rows)}

## Kernels

Ratios against a float32 memcpy of the same numel, and torch.topk(x.abs(), k), in the same run.

{_md_table(("kernel", "numel", "density", "median ms", "time / memcpy", "torch.topk time / this"), kernel_rows)}
"""
    with open(path, "w") as f:
        f.write(text)
