"""Convergence benchmark driver: runs benchmarks.convergence_worker under horovodrun
(unshaped loopback: accuracy does not depend on the network) and returns its records."""

import json
import math
import os
import tempfile

from .network import horovodrun

SEEDS = (0, 1)  # every method trains once per seed; the records give the mean and the spread


def run(task, ranks=2, methods=None, epochs=None, seeds=SEEDS, log=print):
    """The records of `task`, one per method: each trained once per seed (the seeds in one launch),
    then merged."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "records.json")
        args = (
            ["--task", task, "--out", out, "--seeds", *map(str, seeds)]
            + (["--methods", *methods] if methods else [])
            + (["--epochs", str(epochs)] if epochs else [])
        )
        horovodrun(ranks, "benchmarks.convergence_worker", args, "[convergence]", log=log)
        with open(out) as f:
            return merged(json.load(f))


def merged(records):
    """One record per (task, method) from its records of each seed: the mean curve and final,
    with every seed's final under "finals" (a record of one seed stays as it is)."""
    groups = {}
    for r in records:
        groups.setdefault((r["task"], r["method"]), []).append(r)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        epochs = min(len(r["curve"]) for r in group)  # a diverged seed stops early
        curve = [math.fsum(r["curve"][e] for r in group) / len(group) for e in range(epochs)]
        finals = [r["final"] for r in group]
        out.append(
            dict(
                group[0],
                seed=None,
                seeds=[r["seed"] for r in group],
                finals=finals,
                final=math.fsum(finals) / len(finals),
                curve=curve,
            )
        )
    return out


def final_value_text(record):
    """98.6% [98.3-98.9] for accuracy, 1.586 [1.570-1.600] for a loss: the mean over the seeds,
    and their range where there are several."""
    accuracy = record["metric"] == "accuracy"
    shown = (lambda v: f"{100 * v:.1f}") if accuracy else (lambda v: f"{v:.3f}")
    finals = record.get("finals") or [record["final"]]
    text = shown(record["final"]) + ("%" if accuracy else "")
    if len(finals) > 1:
        text += f" [{shown(min(finals))}-{shown(max(finals))}]"
    return text


def change_text(record, dense):
    """+0.2 pt for accuracy, +3.7% for a loss: the mean against dense's mean."""
    if record["metric"] == "accuracy":
        return f"{100 * (record['final'] - dense['final']):+.1f} pt"
    return f"{100 * (record['final'] / dense['final'] - 1):+.1f}%"


def final_text(record, dense=None):
    """final_value_text, then the change against dense's in parentheses where dense is given."""
    return final_value_text(record) + ("" if dense is None else f" ({change_text(record, dense)})")


def table(records):
    final = "final [range over seeds] (vs dense)"
    header = f"{'task':<8}{'method':<24}{'metric':<10}{final:>42}{'bytes/step vs dense':>21}"
    lines = [header, "-" * len(header)]
    dense = {r["task"]: r for r in records if r["method"] == "dense"}
    for r in records:
        base = dense.get(r["task"]) if r["method"] != "dense" else None
        ratio = r["dense_bytes_per_step"] / max(r["sent_bytes_per_step"], 1)
        lines.append(f"{r['task']:<8}{r['method']:<24}{r['metric']:<10}{final_text(r, base):>42}{ratio:>20.0f}x")
    return "\n".join(lines)
