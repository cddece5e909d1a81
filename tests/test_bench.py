"""`python -m sparsecomm.bench kernels` runs and writes one record per measurement with the
fields the results pages rely on (timings are never asserted: they are measured, not tested)."""
import json
import subprocess
import sys


def test_kernel_benchmark_writes_records_with_baselines(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "sparsecomm.bench", "kernels", "--sizes", "20000", "--densities",
                           "0.01", "--repeats", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "x memcpy" in proc.stdout and "topk / op" in proc.stdout
    records = json.loads(out.read_text())["records"]
    assert len(records) == 8
    for r in records:
        assert {"op", "numel", "density", "dtype", "device", "median_ms", "memcpy_ms", "topk_ms"} <= set(r)
        assert r["numel"] == 20000 and r["dtype"] == "float32" and r["median_ms"] > 0
