"""`python -m benchmarks hsdp` (compressed HSDP on 2 hosts of 2 ranks) runs in a quick form and
writes its rows: the floor, native HSDP and the three compressors, each with its step time, the
bytes a host sends across the replicas a step and its ratios (timings are measured, never
asserted); the ratios and the link's cost are the same run's."""

import json
import os
import subprocess
import sys

import pytest
from paths import ROOT

ROWS = ["floor", "native HSDP", "HSDP + DGC 0.1%", "HSDP + Threshold 1%", "HSDP + RandomBlock 1%"]


@pytest.fixture(autouse=True)
def benchmarks_importable(monkeypatch):
    """benchmarks/ is the checkout's, not installed: the ranks import it from wherever they run."""
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", ROOT + (os.pathsep + path if path else ""))


def test_bench_hsdp_runs_every_row_and_the_compressors_send_a_fraction_of_native_hsdp(tmp_path):
    """Unshaped (per-host namespaces where they can be made, else the shared loopback), the comm
    model at a quarter (comm-small), 1 warm-up and 2 timed steps a row, interleaved."""
    out = tmp_path / "hsdp.json"
    command = [sys.executable, "-m", "benchmarks", "hsdp", "--networks", "unshaped", "--model", "comm-small"]
    command += ["--warmup", "1", "--steps", "2"]
    proc = subprocess.run(command + ["--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    records = {r["method"]: r for r in json.loads(out.read_text())["records"]}
    assert list(records) == ROWS
    for r in records.values():
        assert r["ranks"] == 4 and r["ranks_per_host"] == 2 and r["network"] == "unshaped" and r["rounds"] == 2
        assert len(r["step_times_ms"]) == 2 and r["step_ms"] > 0 and r["vs_native"] > 0 and r["vs_floor"] > 0
        assert r["link_ms"] is None and r["modelled_ms"] is None  # no link rate: no cost of it
    native, floor = records["native HSDP"], records["floor"]
    assert native["vs_native"] == floor["vs_floor"] == 1.0
    assert floor["host_sent_bytes"] == 0
    # 2 replicas: a ring all-reduce sends each rank's shard once; the host's two shards are the gradient
    assert native["host_sent_bytes"] == native["dense_bytes"] == 4 * native["parameters"] == 4 * 6_296_064
    assert 0 < records["HSDP + DGC 0.1%"]["host_sent_bytes"] < native["host_sent_bytes"] / 200
    for name in ("HSDP + Threshold 1%", "HSDP + RandomBlock 1%"):
        assert 0 < records[name]["host_sent_bytes"] < native["host_sent_bytes"] / 20
    if native["network_model"].startswith("per-host"):  # what the hosts' NICs sent, measured
        assert floor["nic_sent_bytes"] < 0.1e6  # the barriers only: Horovod is shut down
        assert 0.95 < native["nic_sent_bytes"] / native["host_sent_bytes"] < 1.1  # TCP/IP headers on top
        assert records["HSDP + DGC 0.1%"]["nic_sent_bytes"] < native["nic_sent_bytes"] / 200
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("model"))
    assert all(column in header for column in ("ms/step", "vs native", "vs floor", "host MB/step", "floor+link"))
    assert all(any("unshaped" in line and row in line for line in lines) for row in ROWS)


def test_ratios_link_cost_and_modelled_step_come_from_the_same_run():
    from benchmarks import hsdp

    def row(method, step_ms, sent):
        return dict(method=method, step_ms=step_ms, network="1gbit", host_sent_bytes=sent)

    records = [row("floor", 100.0, 0), row("native HSDP", 900.0, 100e6), row("HSDP + DGC 0.1%", 120.0, 0.25e6)]
    hsdp.add_ratios(records)
    floor, native, dgc = records
    assert native["vs_native"] == 1.0 and native["vs_floor"] == 9.0 and floor["vs_native"] == 9.0
    assert dgc["vs_native"] == 7.5 and dgc["vs_floor"] == 1.2 and dgc["vs_native_interval"] is None
    assert native["link_ms"] == 800.0 and native["modelled_ms"] == 900.0  # 100 MB at 1.25e8 B/s, over the floor
    assert dgc["link_ms"] == 2.0 and dgc["modelled_ms"] == 102.0
    alone = [row("HSDP + DGC 0.1%", 120.0, 0.25e6)]  # no baseline in the run: no ratio, no modelled step
    hsdp.add_ratios(alone)
    assert alone[0]["vs_native"] is None and alone[0]["vs_floor"] is None and alone[0]["modelled_ms"] is None
