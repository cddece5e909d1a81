"""Convergence benchmark driver: runs sparsecomm.bench.convergence_worker under horovodrun
(unshaped loopback: accuracy does not depend on the network) and returns its records."""

import json
import os
import tempfile

from .network import horovodrun


def run(task, ranks=2, methods=None, epochs=None, log=print):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "records.json")
        args = (
            ["--task", task, "--out", out]
            + (["--methods", *methods] if methods else [])
            + (["--epochs", str(epochs)] if epochs else [])
        )
        horovodrun(ranks, "sparsecomm.bench.convergence_worker", args, "[convergence]", log=log)
        with open(out) as f:
            return json.load(f)


def table(records):
    header = f"{'task':<8}{'method':<24}{'metric':<10}{'final':>9}{'vs dense':>10}{'bytes/step vs dense':>21}"
    lines = [header, "-" * len(header)]
    dense = {r["task"]: r["final"] for r in records if r["method"] == "dense"}
    for r in records:
        base = dense.get(r["task"])
        if r["metric"] == "accuracy":
            delta = f"{100 * (r['final'] - base):+.1f} pt" if base is not None else ""
            final = f"{100 * r['final']:.1f}%"
        else:
            delta = f"{100 * (r['final'] / base - 1):+.1f}%" if base is not None else ""
            final = f"{r['final']:.3f}"
        ratio = r["dense_bytes_per_step"] / max(r["sent_bytes_per_step"], 1)
        lines.append(f"{r['task']:<8}{r['method']:<24}{r['metric']:<10}{final:>9}{delta:>10}{ratio:>20.0f}x")
    return "\n".join(lines)
