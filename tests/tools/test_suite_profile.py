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
        "| `tests.b` | 20 | 57.1% | 1 | 75% |",
        "| `tests.a` | 15 | 42.9% | 2 | 30% |",
        "| all | 35 | | 3 | |",
    ]


def test_top_keeps_the_longest_files_and_a_missing_log_leaves_idle_unknown(tmp_path):
    assert profile(tmp_path, "junit.xml", "absent.log", "--top", "1") == [
        "| `tests.b` | 20 | 57.1% | 1 | - |",
        "| all | 35 | | 3 | |",
    ]


def test_tests_of_two_workers_start_where_their_started_property_says(tmp_path):
    """Two workers: a.x runs 0-10 s and b.z 2-22 s beside it (their `started` property, which
    tests/conftest.py writes); without it b.z would start at 10 s."""
    import datetime

    epoch = datetime.datetime(2026, 1, 1).timestamp()  # local time, as vmstat -t prints it

    def case(name, test, started, seconds):
        started = f'<properties><property name="started" value="{epoch + started:.3f}"/></properties>'
        return f'<testcase classname="{name}" name="{test}" time="{seconds}">{started}</testcase>'

    junit = JUNIT.split("<testcase")[0] + case("tests.a", "x", 0, 10.0) + case("tests.b", "z", 2, 20.0)
    (tmp_path / "junit.xml").write_text(junit + "</testsuite></testsuites>\n")
    (tmp_path / "vmstat.log").write_text(VMSTAT)
    out = subprocess.run(
        [sys.executable, SCRIPT, "junit.xml", "vmstat.log"], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.stdout.splitlines()[2:] == [
        "| `tests.b` | 20 | 66.7% | 1 | 50% |",
        "| `tests.a` | 10 | 33.3% | 1 | 40% |",
        "| all | 30 | | 2 | |",
    ], out.stdout + out.stderr
