"""Soak: every compressor trains the digits MLP on 2 ranks under real horovodrun for thousands
of steps, side by side (tests/workers/soak.py), and after warm-up each rank's resident memory,
live tensors and traces stay flat: no state, buffer or Python object piles up step after step.
Figures and bounds: docs/testing.md, "Soak"."""

import json
import re

from launch import horovodrun

COMPRESSORS = ("TopK_auto", "TopK", "RTopK", "RandomK", "RandomBlock", "Threshold", "DGC", "Threshold_2bit")
# Resident growth allowed from the warm-up sample to the last, over the 1,000 steps between them:
# 6 times torch's largest growth measured side by side and 3 times TF's (docs/testing.md, "Soak");
# a leak of about 260 bytes a step (torch) or 520 (TF) reaches it.
RSS_BOUND = {"torch": 1 << 18, "tf": 1 << 19}
STEPS, WARMUP, EVERY = 1500, 500, 500


def soak(framework, *extra, timeout=900):
    """Runs the worker on 2 ranks: {rank: its report (samples, seconds, routes per compressor)}."""
    options = ["--framework", framework, "--steps", STEPS, "--warmup", WARMUP, "--every", EVERY, *extra]
    output = horovodrun(2, "soak.py", *options, timeout=timeout)
    lines = re.findall(rf"soak {framework} rank (\d) (\{{.*\}})", output)
    reports = {int(rank): json.loads(line) for rank, line in lines}
    assert sorted(reports) == [0, 1], output[-4000:]
    for report in reports.values():
        assert list(report["routes"]) == list(COMPRESSORS), output[-4000:]
    return reports


def check_flat(reports, framework):
    """Per rank: tensor counts (and TF's traces) exactly constant from the warm-up sample on,
    resident growth within the framework's RSS_BOUND; every failure listed at once. Prints the
    figures (pytest -rP shows them)."""
    failures = []
    for rank, report in sorted(reports.items()):
        samples = report["samples"]
        assert [s["step"] for s in samples] == list(range(WARMUP, STEPS + 1, EVERY))
        tensors = [s["tensors"] for s in samples]
        growth = samples[-1]["rss"] - samples[0]["rss"]
        figures = (
            f"rank {rank}: tensors {tensors}, RSS {samples[0]['rss'] / 2**20:.2f} -> "
            f"{samples[-1]['rss'] / 2**20:.2f} MiB ({growth / 2**20:+.2f}, bound {RSS_BOUND[framework] / 2**20:g})"
        )
        if len(set(tensors)) != 1:
            failures.append(f"live tensors changed: {figures}")
        if growth > RSS_BOUND[framework]:
            failures.append(f"resident memory grew: {figures}")
        traces = [s.get("traces") for s in samples]
        if len(set(traces)) != 1:
            failures.append(f"the step was traced again: {traces}: {figures}")
        print(f"{figures}, traces {traces[-1]}, {report['seconds']} s, routes {report['routes']}")
    assert not failures, "\n".join(failures) + "\n(the figures are the process's: soak.py --only NAME reruns one)"


def test_torch_compressors_hold_memory_and_tensors_flat_over_1500_steps():
    check_flat(soak("torch"), "torch")


def test_tf_compressors_hold_memory_tensors_and_traces_flat_over_1500_steps():
    check_flat(soak("tf"), "tf")
