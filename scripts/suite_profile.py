"""Where the suite's time goes, per test file: seconds, tests, and how idle the cores were.

    vmstat -t 10 > vmstat.log &            # the cores' idle share, every 10 s
    make test PYTEST_ARGS="--junitxml=junit.xml"
    python scripts/suite_profile.py junit.xml vmstat.log [--top N]

CI (.ci/run) prints the 20 longest files after the suite.

A test's start is its `started` property (tests/conftest.py writes it; make test's two workers run
tests side by side), or else the suite's start plus the times of the tests before it. Idle is
vmstat's `id` column averaged over a file's samples; a file shorter than vmstat's interval may have
none, and without the log none has (-)."""

import argparse
import collections
import datetime
import os
import xml.etree.ElementTree as ElementTree


def test_spans(junit_path):
    """[(test file, start, seconds)] in run order, from pytest's JUnit XML."""
    root = ElementTree.parse(junit_path).getroot()
    suite = root.find("testsuite") if root.tag == "testsuites" else root
    start = datetime.datetime.fromisoformat(suite.get("timestamp")).replace(tzinfo=None)
    spans = []
    for case in suite.iter("testcase"):
        seconds = float(case.get("time"))
        started = case.find("properties/property[@name='started']")
        begun = start if started is None else datetime.datetime.fromtimestamp(float(started.get("value")))
        spans.append((case.get("classname"), begun, seconds))
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
    """{test file: [seconds, tests, idle percents seen]}."""
    files = collections.defaultdict(lambda: [0.0, 0, []])
    for name, start, seconds in spans:
        end = start + datetime.timedelta(seconds=seconds)
        row = files[name]
        row[0] += seconds
        row[1] += 1
        row[2].extend(idle for when, idle in samples if start <= when <= end)
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit")
    parser.add_argument("vmstat", nargs="?")
    parser.add_argument("--top", type=int, default=None, help="the N longest files only")
    args = parser.parse_args()
    sampled = args.vmstat and os.path.exists(args.vmstat)
    files = per_file(test_spans(args.junit), idle_samples(args.vmstat) if sampled else [])
    total = sum(seconds for seconds, _, _ in files.values())
    print("| test file | seconds | share | tests | cores idle |\n|---|---|---|---|---|")
    for name, (seconds, tests, idle) in sorted(files.items(), key=lambda item: -item[1][0])[: args.top]:
        shown = f"{sum(idle) / len(idle):.0f}%" if idle else "-"
        print(f"| `{name}` | {seconds:.0f} | {seconds / total:.1%} | {tests} | {shown} |")
    print(f"| all | {total:.0f} | | {sum(tests for _, tests, _ in files.values())} | |")


if __name__ == "__main__":
    main()
