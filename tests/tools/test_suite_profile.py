"""scripts/suite_profile.py, as CI runs it: a hand-made JUnit XML and vmstat log, and the per-file
table worked out by hand (each test starts where the one before it ended)."""

import os
import subprocess
import sys

from paths import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "suite_profile.py")
# Three tests from 00:00:00: a.x 0-10 s, a.y 10-15 s, b.z 15-35 s.
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" timestamp="2026-01-01T00:00:00.000000+00:00" time="35.0">
<testcase classname="tests.a" name="x" time="10.0"/>
<testcase classname="tests.a" name="y" time="5.0"/>
<testcase classname="tests.b" name="z" time="20.0"/>
</testsuite></testsuites>
"""
# vmstat -t's two header lines, then samples at 5 s (idle 40), 12 s (20): a's; 20 s (90), 30 s (60): b's.
VMSTAT = """procs -----------memory---------- ---swap-- -----io---- -system-- ------cpu----- -----timestamp-----
 r  b   swpd   free   buff  cache   si   so    bi    bo   in   cs us sy id wa st                 UTC
 1  0      0 100 100 100    0    0   0  0 10 10 50 10 40  0  0 2026-01-01 00:00:05
 1  0      0 100 100 100    0    0   0  0 10 10 70 10 20  0  0 2026-01-01 00:00:12
 1  0      0 100 100 100    0    0   0  0 10 10  5  5 90  0  0 2026-01-01 00:00:20
 1  0      0 100 100 100    0    0   0  0 10 10 30 10 60  0  0 2026-01-01 00:00:30
"""


def profile(tmp_path, *args):
    (tmp_path / "junit.xml").write_text(JUNIT)
    (tmp_path / "vmstat.log").write_text(VMSTAT)
    out = subprocess.run([sys.executable, SCRIPT, *args], cwd=tmp_path, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[2:]  # after the table's header


def test_each_file_gets_its_seconds_share_and_the_idle_samples_inside_its_tests(tmp_path):
    assert profile(tmp_path, "junit.xml", "vmstat.log") == [
        "| `tests.b` | 20 | 57.1% | 1 | 75% | - |",
        "| `tests.a` | 15 | 42.9% | 2 | 30% | - |",
        "| all | 35 | | 3 | | - |",
    ]


def test_top_keeps_the_longest_files_and_a_missing_log_leaves_idle_unknown(tmp_path):
    assert profile(tmp_path, "junit.xml", "absent.log", "--top", "1") == [
        "| `tests.b` | 20 | 57.1% | 1 | - | - |",
        "| all | 35 | | 3 | | - |",
    ]


def test_tests_of_two_workers_start_where_their_started_property_says(tmp_path):
    """Two workers: a.x runs 0-10 s and b.z 2-22 s beside it (their `started` property, which
    tests/conftest.py writes); without it b.z would start at 10 s. Their `cpu` properties add up
    per file and in all."""
    import datetime

    epoch = datetime.datetime(2026, 1, 1).timestamp()  # local time, as vmstat -t prints it

    def case(name, test, started, seconds, cpu):
        started = f'<property name="started" value="{epoch + started:.3f}"/><property name="cpu" value="{cpu}"/>'
        return (
            f'<testcase classname="{name}" name="{test}" time="{seconds}"><properties>{started}</properties></testcase>'
        )

    cases = case("tests.a", "x", 0, 10.0, 12.5), case("tests.b", "z", 2, 20.0, 30.25)
    junit = JUNIT.split("<testcase")[0] + "".join(cases)
    (tmp_path / "junit.xml").write_text(junit + "</testsuite></testsuites>\n")
    (tmp_path / "vmstat.log").write_text(VMSTAT)
    out = subprocess.run(
        [sys.executable, SCRIPT, "junit.xml", "vmstat.log"], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.stdout.splitlines()[2:] == [
        "| `tests.b` | 20 | 66.7% | 1 | 50% | 30 |",
        "| `tests.a` | 10 | 33.3% | 1 | 40% | 12 |",
        "| all | 30 | | 2 | | 43 |",
    ], out.stdout + out.stderr


def test_the_suite_records_when_each_test_started_and_its_cpu_with_its_children(tmp_path):
    """tests/conftest.py as a plugin of a one-test run: the test burns 0.5 CPU seconds in a child
    process it waits for, which its `cpu` property counts."""
    import time
    import xml.etree.ElementTree as ElementTree

    burn = "import time\nstart = time.process_time()\nwhile time.process_time() - start < 0.5: pass"
    test = f"import subprocess, sys\n\n\ndef test_burn():\n    subprocess.run([sys.executable, '-c', {burn!r}])\n"
    (tmp_path / "test_burn.py").write_text(test)
    tests = os.pathsep.join(filter(None, [os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH")]))
    pytest_args = "-q -p conftest -p no:cacheprovider --junitxml=j.xml test_burn.py".split()
    before = time.time()
    run = [sys.executable, "-m", "pytest", *pytest_args]
    subprocess.run(run, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=tests), check=True, capture_output=True)
    case = ElementTree.parse(tmp_path / "j.xml").getroot().find(".//testcase")
    found = {p.get("name"): float(p.get("value")) for p in case.iter("property")}
    assert before <= found["started"] <= time.time(), found
    assert 0.5 <= found["cpu"] < 5, found


def test_every_late_multi_rank_file_exists():
    """A LATE file renamed or removed would leave a stale name behind (tests/conftest.py)."""
    from conftest import LATE

    assert LATE and all(os.path.exists(os.path.join(ROOT, path)) for path in LATE), LATE
