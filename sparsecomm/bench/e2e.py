"""End-to-end benchmark: step time of a communication-heavy and a compute-heavy model under
horovodrun, dense vs each sparsecomm method, on an emulated 1 Gbit/s and 10 Gbit/s network
(sparsecomm.bench.network) and on unshaped loopback; the speedup is against dense measured
in the same run (same ranks, same network)."""
import json
import os
import tempfile

from . import network

NETWORKS = ("1gbit", "10gbit", None)  # None: unshaped loopback


def run_one(ranks, net, model, methods, warmup, steps, log=print):
    """Records of one horovodrun (all methods for one model, ranks and network)."""
    with tempfile.TemporaryDirectory() as tmp, network.shaped(net) as prefix:
        out = os.path.join(tmp, "records.json")
        network.horovodrun(ranks, "sparsecomm.bench.e2e_worker",
                           ["--model", model, "--out", out, "--warmup", str(warmup), "--steps", str(steps),
                            "--methods", *methods], "[e2e]", prefix, log)
        with open(out) as f:
            records = json.load(f)
    for record in records:
        record["network"] = net if prefix is not None else "unshaped"
    dense = {r["step_ms"] for r in records if r["method"] == "dense"}
    for record in records:
        record["speedup_vs_dense"] = (min(dense) / record["step_ms"]) if dense else None
    return records


def table(records):
    """A text table: one row per (model, ranks, network, method)."""
    header = (f"{'model':<8}{'ranks':>6}  {'network':<9}{'method':<21}{'ms/step':>10}{'speedup':>9}"
              f"{'recv MB/rank/step':>19}  exchange")
    lines = [header, "-" * len(header)]
    for r in records:
        lines.append(f"{r['model']:<8}{r['ranks']:>6}  {r['network']:<9}{r['method']:<21}{r['step_ms']:>10.1f}"
                     f"{r['speedup_vs_dense']:>8.2f}x{r['received_bytes'] / 1e6:>19.3f}  {','.join(r['exchanges'])}")
    return "\n".join(lines)
