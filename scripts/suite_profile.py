"""Where the suite's time goes, per test file: seconds, tests, how idle the cores were, CPU seconds.

    vmstat -t 10 > vmstat.log &            # the cores' idle share, every 10 s
    make test PYTEST_ARGS="--junitxml=junit.xml"
    python scripts/suite_profile.py junit.xml vmstat.log [--top N]

CI (.ci/run) prints the 20 longest files after the suite.

A test's start is its `started` property (tests/conftest.py writes it; make test's two workers run
tests side by side), or else the suite's start plus the times of the tests before it. Idle is
vmstat's `id` column averaged over a file's samples; a file shorter than vmstat's interval may have
none, and without the log none has (-). CPU seconds are the `cpu` property (the test's process and
the processes it started and waited for; - where no test of the file has it)."""

import argparse
import collections
import datetime
import os
import xml.etree.ElementTree as ElementTree


def _property(case, name):
    found = case.find(f"properties/property[@name='{name}']")
    return None if found is None else float(found.get("value"))


def test_spans(junit_path):
    """[(test file, start, seconds, CPU seconds or None)] in run order, from pytest's JUnit XML."""
    root = ElementTree.parse(junit_path).getroot()
    suite = root.find("testsuite") if root.tag == "testsuites" else root
    start = datetime.datetime.fromisoformat(suite.get("timestamp")).replace(tzinfo=None)
    spans = []
    for case in suite.iter("testcase"):
        seconds = float(case.get("time"))
        started = _property(case, "started")
        begun = start if started is None else datetime.datetime.fromtimestamp(started)
        spans.append((case.get("classname"), begun, seconds, _property(case, "cpu")))
        start += datetime.timedelta(seconds=seconds)
    return spans


def idle_samples(vmstat_path):
    """[(local time, idle percent)] from `vmstat -t` output (its last two fields: date, time)."""
    samples = []
    with open(vmstat_path) as log:
        header = None
        for line in log:
            fields = line.split()
            if "id" in fields:
                header = fields.index("id")
            elif header is not None and fields and fields[0].isdigit():
                when = datetime.datetime.fromisoformat(f"{fields[-2]} {fields[-1]}")
                samples.append((when, int(fields[header])))
    return samples


def per_file(spans, samples):
    """{test file: [seconds, tests, idle percents seen, CPU seconds or None]}."""
    files = collections.defaultdict(lambda: [0.0, 0, [], None])
    for name, start, seconds, cpu in spans:
        end = start + datetime.timedelta(seconds=seconds)
        row = files[name]
        row[0] += seconds
        row[1] += 1
        row[2].extend(idle for when, idle in samples if start <= when <= end)
        if cpu is not None:
            row[3] = (row[3] or 0.0) + cpu
    return files


def _cpu(seconds):
    return "-" if seconds is None else f"{seconds:.0f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit")
    parser.add_argument("vmstat", nargs="?")
    parser.add_argument("--top", type=int, default=None, help="the N longest files only")
    args = parser.parse_args()
    sampled = args.vmstat and os.path.exists(args.vmstat)
    files = per_file(test_spans(args.junit), idle_samples(args.vmstat) if sampled else [])
    total = sum(row[0] for row in files.values())
    cpus = [row[3] for row in files.values() if row[3] is not None]
    print("| test file | seconds | share | tests | cores idle | CPU s |\n|---|---|---|---|---|---|")
    for name, (seconds, tests, idle, cpu) in sorted(files.items(), key=lambda item: -item[1][0])[: args.top]:
        shown = f"{sum(idle) / len(idle):.0f}%" if idle else "-"
        print(f"| `{name}` | {seconds:.0f} | {seconds / total:.1%} | {tests} | {shown} | {_cpu(cpu)} |")
    tests = sum(row[1] for row in files.values())
    print(f"| all | {total:.0f} | | {tests} | | {_cpu(sum(cpus) if cpus else None)} |")


if __name__ == "__main__":
    main()
