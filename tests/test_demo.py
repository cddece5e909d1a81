"""`make demo` end to end (one short epoch): it runs 2 ranks and prints the table."""
import json
import subprocess
import sys


def test_demo_prints_the_table(tmp_path):
    out = tmp_path / "demo.json"
    proc = subprocess.run([sys.executable, "-m", "sparsecomm.demo", "--epochs", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for line in ("test accuracy", "bytes/rank/step", "dense", "dense, momentum 0.9", "RandomBlock 10%", "RandomBlock 1%",
                 "TopK 1%", "Threshold 1%", "DGC 1%"):
        assert line in proc.stdout, proc.stdout
    assert "{" not in proc.stdout, proc.stdout  # no unformatted placeholders
    report = json.loads(out.read_text())
    assert report["ranks"] == 2
    by_method = {r["method"]: r for r in report["results"]}
    dense = by_method["dense"]["bytes_per_step"]
    assert dense == 4 * (64 * 256 + 256 + 256 * 10 + 10)
    # The weights send max(1, round(ratio * numel)) elements; the biases go dense (default policy).
    biases = 4 * (256 + 10)
    assert by_method["RandomBlock 10%"]["bytes_per_step"] == 4 * (1638 + 256) + biases
    assert by_method["RandomBlock 1%"]["bytes_per_step"] == 4 * (164 + 26) + biases
    assert by_method["TopK 1%"]["bytes_per_step"] == (4 + 4) * (164 + 26) + biases  # values + int32 indices
    assert by_method["dense"]["accuracy"] > 0.5  # one epoch of dense training learns something
    # Threshold sends about k (within [0.8 k, 1.3 k]); DGC is still warming up after one epoch
    # (density 0.01 ** (1/5) = 40%) but sends less than dense.
    assert by_method["Threshold 1%"]["bytes_per_step"] < dense / 3
    assert by_method["DGC 1%"]["bytes_per_step"] < dense
