"""End-to-end benchmark: step time of a communication-heavy and a compute-heavy model under
horovodrun, dense vs each sparsecomm method, on an emulated 1 Gbit/s and 10 Gbit/s network
(sparsecomm.bench.network) and on unshaped loopback; the speedup is against dense measured
in the same run (same ranks, same network)."""
import json
import os
import subprocess
import sys
import tempfile

from . import network

NETWORKS = ("1gbit", "10gbit", None)  # None: unshaped loopback


def run_one(ranks, net, model, methods, warmup, steps, log=print):
    """Records of one horovodrun (all methods for one model, ranks and network)."""
    bin_dir = os.path.dirname(sys.executable)
    with tempfile.TemporaryDirectory() as tmp, network.shaped(net) as prefix:
        out = os.path.join(tmp, "records.json")
        cmd = (prefix or []) + [os.path.join(bin_dir, "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}",
                                "--gloo", sys.executable, "-m", "sparsecomm.bench.e2e_worker", "--model", model,
                                "--out", out, "--warmup", str(warmup), "--steps", str(steps), "--methods", *methods]
        env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3",
                   PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail = []
        for line in proc.stdout:
            tail = (tail + [line])[-40:]
            if "[e2e]" in line:
                log("   " + line.split("[e2e]", 1)[1].strip())
        if proc.wait() != 0:
            raise RuntimeError(f"horovodrun failed ({' '.join(cmd[:8])} ...):\n{''.join(tail)}")
        with open(out) as f:
            records = json.load(f)
    shaped = prefix is not None
    for record in records:
        record["network"] = net if shaped else "unshaped"
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
