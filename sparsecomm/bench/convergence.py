"""Convergence benchmark driver: runs sparsecomm.bench.convergence_worker under horovodrun
(unshaped loopback: accuracy does not depend on the network) and returns its records."""
import json
import os
import subprocess
import sys
import tempfile


def run(task, ranks=2, methods=None, epochs=None, log=print):
    bin_dir = os.path.dirname(sys.executable)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "records.json")
        cmd = [os.path.join(bin_dir, "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo",
               sys.executable, "-m", "sparsecomm.bench.convergence_worker", "--task", task, "--out", out]
        if methods:
            cmd += ["--methods", *methods]
        if epochs:
            cmd += ["--epochs", str(epochs)]
        env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3",
                   PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail = []
        for line in proc.stdout:
            tail = (tail + [line])[-40:]
            if "[convergence]" in line:
                log("   " + line.split("[convergence]", 1)[1].strip())
        if proc.wait() != 0:
            raise RuntimeError(f"horovodrun failed ({task}):\n{''.join(tail)}")
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
