"""`make demo` end to end, shrunk (unshaped loopback, the comm model at a quarter, 1 timed step,
1 epoch): it runs 2 ranks, prints the table and writes the figure and the JSON; with --ddp,
through PyTorch DDP."""

import json
import subprocess
import sys

import pytest

ROWS = {"horovod": ("dense", "DGC 0.1% auto"), "ddp": ("DDP dense", "DDP + DGC 0.1%")}


@pytest.mark.parametrize("way", list(ROWS))
def test_demo_prints_the_table_and_writes_the_figure(tmp_path, way):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.demo",
            "--network",
            "unshaped",
            "--model",
            "comm-small",
            "--steps",
            "1",
            "--epochs",
            "1",
            "--out",
            str(tmp_path),
            *(["--ddp"] if way == "ddp" else []),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    dense, dgc = ROWS[way]
    for text in ("ms/step", "speedup", "digits accuracy", dense, dgc):
        assert text in proc.stdout, proc.stdout
    assert "{" not in proc.stdout.split("sparsecomm demo:")[1], proc.stdout  # no unformatted placeholders
    report = json.loads((tmp_path / "demo.json").read_text())
    rows = {r["method"]: r for r in report["rows"]}
    assert rows[dense]["speedup"] == 1.0 and rows[dense]["exchange"] == "allreduce"
    assert rows[dense]["accuracy"] > 0.5  # one epoch of dense training learns something
    assert rows[dgc]["bytes_vs_dense"] > 1  # DGC sends less, warm-up included
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"
