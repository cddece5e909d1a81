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
    assert len(records) == 10  # 8 kernels, then the TopK and Threshold paths (DGC's only at densities <= 0.1%)
    assert [r["op"].split()[0] for r in records[-2:]] == ["TopK", "Threshold"]
    for r in records:
        assert {"op", "numel", "density", "dtype", "device", "median_ms", "memcpy_ms", "topk_ms"} <= set(r)
        assert r["numel"] == 20000 and r["dtype"] == "float32" and r["median_ms"] > 0


def test_make_bench_pipeline_end_to_end_on_a_tiny_setting(tmp_path):
    """`python -m sparsecomm.bench all` (what `make bench` runs), shrunk: kernels on 20,000
    elements, the compute model for 1 step on 2 unshaped ranks (dense and DGC), digits for 1
    epoch (dense and DGC). It must write the JSON, both figures and the results page."""
    md = tmp_path / "results.md"
    proc = subprocess.run([sys.executable, "-m", "sparsecomm.bench", "all", "--out", str(tmp_path / "out"),
                           "--results-md", str(md), "--sizes", "20000", "--densities", "0.01", "--repeats", "1",
                           "--ranks", "2", "--networks", "unshaped", "--models", "compute",
                           "--e2e-methods", "dense", "DGC 0.1% spardl", "--warmup", "1", "--steps", "1",
                           "--tasks", "digits", "--convergence-methods", "dense", "DGC 0.1%", "--epochs", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["method"] for r in results["e2e"]] == ["dense", "DGC 0.1% spardl"]
    assert results["e2e"][0]["speedup_vs_dense"] == 1.0 and results["e2e"][1]["exchanges"] == ["spardl"]
    assert [r["method"] for r in results["convergence"]] == ["dense", "DGC 0.1%"]
    assert all(0 <= r["final"] <= 1 for r in results["convergence"])
    for figure in ("e2e_speedup.png", "convergence.png"):
        assert (tmp_path / "out" / figure).read_bytes()[:4] == b"\x89PNG"
    text = md.read_text()
    assert "## End-to-end step time" in text and "| compute | 2 | unshaped | DGC 0.1% spardl |" in text
