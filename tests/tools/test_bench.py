"""`python -m benchmarks` runs and writes records with the fields the results pages rely on
(timings are never asserted: they are measured, not tested); the per-host network model builds,
runs and cleans up after itself."""

import csv
import json
import os
import re
import statistics
import subprocess
import sys
import time

import pytest
from paths import ROOT, WORKERS

from benchmarks.e2e import ratio_text


@pytest.fixture(autouse=True)
def benchmarks_importable(monkeypatch):
    """benchmarks/ is the checkout's, not installed: the processes these tests start import it
    from wherever they run (a temporary folder, horovodrun's ranks)."""
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", ROOT + (os.pathsep + path if path else ""))


# A commit's hash, as tests/tools/test_docs.py finds one: 7 to 40 hex digits with a letter and a digit, a
# whole word (a data set's "sha256 ..." is a checksum, not a commit); and a date.
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
DATE = re.compile(r"20\d\d-\d\d-\d\d")


def commit_hashes(text):
    return [
        match.group()
        for line in text.splitlines()
        for match in COMMIT_HASH.finditer(line)
        if not line[: match.start()].endswith("sha256 ")
    ]


def test_kernel_benchmark_writes_records_with_baselines(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "kernels",
            "--sizes",
            "20000",
            "--densities",
            "0.01",
            "--repeats",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "x memcpy" in proc.stdout and "topk / op" in proc.stdout
    records = json.loads(out.read_text())["records"]
    # 11 kernels (the wire's 3 last), then the TopK and Threshold paths (DGC's only at densities
    # <= 0.1%), torch's and TF's; then on ResNet-50's 161 tensors, torch's paths and Horovod with no
    # compression
    assert len(records) == 18
    assert [r["op"].split()[0] for r in records[8:11]] == ["wire_rows", "wire_columns", "copy"]
    assert [r["op"] for r in records[11:15]] == [
        f"{prefix}{name} whole path (1 rank)" for prefix in ("", "TF ") for name in ("TopK", "Threshold")
    ]
    assert [r["op"].split()[0] for r in records[15:]] == ["TopK", "Threshold", "Horovod,"]
    for r in records:
        assert {"op", "numel", "density", "dtype", "device", "median_ms", "memcpy_ms", "topk_ms"} <= set(r)
        assert r["dtype"] == "float32" and r["density"] == 0.01 and r["median_ms"] > 0
    assert [r["numel"] for r in records] == [20000] * 15 + [25_557_032] * 3
    assert all(r["tensors"] == 161 and "ResNet-50's 161 tensors" in r["op"] for r in records[15:])


def test_kernel_benchmark_runs_without_horovod_and_e2e_says_it_needs_it(tmp_path):
    # A GPU machine's stock image has torch and no Horovod: the kernels are what it can time.
    def bench(*args):
        hide = "import runpy, sys; sys.modules['horovod'] = None; sys.argv[0] = 'bench'; "
        code = hide + "runpy.run_module('benchmarks', run_name='__main__')"
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)

    out = tmp_path / "bench.json"
    proc = bench("kernels", "--sizes", "20000", "--densities", "0.01", "--repeats", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Horovod is not installed: the whole-path rows" in proc.stdout
    records = json.loads(out.read_text())["records"]
    assert len(records) == 11 and not any("whole path" in r["op"] for r in records)
    proc = bench("e2e", "--ranks", "2")
    assert proc.returncode == 2 and "e2e: the end-to-end benchmark needs Horovod" in proc.stderr


def refused(monkeypatch, capsys, *argv):
    """`python -m benchmarks *argv`, run in this process up to its refusal: (exit code, stderr).
    In this process, since the refusal comes before anything runs (a launch costs 1.7 s)."""
    from benchmarks import __main__ as cli
    from benchmarks import report

    def accepted():
        raise AssertionError(f"benchmarks {' '.join(argv)}: not refused")

    monkeypatch.setattr(sys, "argv", ["benchmarks", *argv])
    monkeypatch.setattr(cli.signal, "signal", lambda *_: None)  # the CLI's SIGTERM handler, not pytest's
    monkeypatch.setattr(report, "code_version", accepted)  # the first step after the checks
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    return stopped.value.code, capsys.readouterr().err


@pytest.mark.parametrize("layout", ["2x1", "1x2", "2by2", "x"])
def test_a_host_layout_needs_two_hosts_of_two_ranks_or_more(layout, monkeypatch, capsys):
    """`bench all --host-layouts` takes HxR; anything else is refused before anything runs."""
    code, said = refused(monkeypatch, capsys, "all", "--host-layouts", layout)
    assert code == 2 and f"a layout should be HxR (hosts x ranks a host, both >= 2), got {layout!r}" in said, said


def _check_the_tiny_page(out, text, results):
    """The page and the CSV files of the tiny `make bench`: the compute model's rows, narrow on the page
    and wide (every interval) in e2e.csv; the convergence means, their ranges in convergence.csv."""
    from benchmarks import report

    e2e = {r["method"]: r for r in results["e2e"]}
    data = results["convergence"][0]["data"]

    def row(method, exchange):  # model, method, then the cell's ms/step, vs dense, vs floor, received MB, exchange
        r = e2e[method]
        return [
            "compute",
            method,
            f"{r['step_ms']:.1f}",
            ratio_text(r["vs_dense"], r["vs_dense_interval"]),
            ratio_text(r["vs_floor"], r["vs_floor_interval"]),
            f"{r['received_bytes'] / 1e6:.3f}",
            exchange,
        ]

    with open(out / "e2e.csv", newline="") as f:  # the wide table, every column and interval
        wide = list(csv.reader(f))
    assert wide[0] == ["model", "method"] + [f"2 ranks unshaped {what}" for what in report.E2E_FIGURES]
    assert row("DGC 0.1% spardl", "spardl") in wide and row("floor", "-") in wide
    assert "## End-to-end step time" in text and "[e2e.csv](out/e2e.csv)" in text
    # the page: the compute model (the only one timed) per cell, narrow, one figure a column
    dgc = e2e["DGC 0.1% spardl"]
    assert "| method | 2 ranks unshaped | 2 ranks MB |" in text
    assert f"| DGC 0.1% spardl | {dgc['step_ms']:.1f} | {dgc['received_bytes'] / 1e6:.3f} |" in text
    assert f"- **Network model: {results['e2e'][0]['network_model']}.**" in text and "- **Rows.**" in text
    assert "The compute model's rows were timed in 2 interleaved turns" in text
    assert f"- Data: digits: {data['source']}, sha256 {data['sha256'][:16]}." in text
    dense = results["convergence"][0]
    assert f"| dense | {100 * dense['final']:.1f}% | +0.0 pt |" in text  # the mean; its range in convergence.csv
    finals = sorted(100 * f for f in dense["finals"])
    ranged = f"dense,{100 * dense['final']:.1f}% [{finals[0]:.1f}-{finals[1]:.1f}],+0.0 pt,"
    assert (out / "convergence.csv").read_text().splitlines()[1].startswith(ranged)
    words = " ".join(text.split())  # (the page's paragraphs are wrapped)
    assert "once per seed (0, 1:" in words
    assert "after its linear warm-up, and the clipping: digits 0.05 after 0.25 epochs" in words  # a quarter of 1 epoch
    assert (
        text.index("## Summary")
        < text.index("## Figures")
        < text.index("## End-to-end step time")
        < text.index("## How it was measured")
    )
    assert len(text.splitlines()) < 200 and max(map(len, text.splitlines())) <= 400
    assert str(out.parent) not in text  # no directory of the machine that made it


def test_make_bench_pipeline_end_to_end_on_a_tiny_setting(tmp_path):
    """`python -m benchmarks all` (what `make bench` runs), shrunk: kernels on 20,000
    elements (no model's tensors), the compute model for 2 steps (interleaved, one a turn) on 2 unshaped ranks (the
    floor, dense, DGC, DDP dense and DDP PowerSGD), digits for 1 epoch (dense and DGC). It must
    write the JSON, both figures, the wide tables as CSV files and the results page."""
    md = tmp_path / "results.md"
    rows = ["floor", "dense", "DGC 0.1% spardl", "DDP dense", "DDP PowerSGD", "DDP + DGC 0.1%"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "all",
            "--out",
            str(tmp_path / "out"),
            "--results-md",
            str(md),
            "--sizes",
            "20000",
            "--densities",
            "0.01",
            "--repeats",
            "1",
            "--kernel-models",
            "--ranks",
            "2",
            "--networks",
            "unshaped",
            "--models",
            "compute",
            "--e2e-methods",
            *rows,
            "--host-layouts",  # none: the hosts' cells run the comm model on 4 and 6 ranks
            "--trial-layouts",  # none: the first steps' cells run the comm model for 100 steps a row
            "--hsdp-layouts",  # none: compressed HSDP runs the comm model on 4 ranks (test_bench_hsdp.py)
            "--hsdp-convergence-methods",  # none: 4 ranks of digits, each row twice
            "--hook-step-layouts",  # the DDP hook's step on one rank: 161 small matrices against 16, one step
            "small",
            "--hook-step-steps",
            "1",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--tasks",
            "digits",
            "--convergence-methods",
            "dense",
            "DGC 0.1%",
            "--epochs",
            "1",
            "--seeds",
            "0",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    e2e = {r["method"]: r for r in results["e2e"]}
    assert [r["method"] for r in results["e2e"]] == rows
    assert e2e["dense"]["speedup_vs_dense"] == e2e["dense"]["vs_dense"] == 1.0
    assert e2e["floor"]["vs_floor"] == 1.0 and e2e["floor"]["received_bytes"] == 0
    assert e2e["DGC 0.1% spardl"]["exchanges"] == ["spardl"]
    assert {r["rounds"] for r in results["e2e"]} == {2}  # the compute model's rows fit: one step a turn
    floor_times = e2e["floor"]["step_times_ms"]
    for r in results["e2e"]:
        assert r["network_model"] in ("per-host", "shared") and r["network"] == "unshaped"
        assert len(r["step_times_ms"]) == 2 and r["step_ms"] == statistics.median(r["step_times_ms"]) > 0
        # interleaved rows: paired step by step
        assert r["vs_floor"] == statistics.median(a / b for a, b in zip(r["step_times_ms"], floor_times)) > 0
    assert e2e["DDP dense"]["received_bytes"] == e2e["dense"]["received_bytes"]  # the same ring, same gradient
    # the timed PowerSGD step compressed: rank-4 factors are far smaller than the gradient
    assert 0 < e2e["DDP PowerSGD"]["received_bytes"] < e2e["DDP dense"]["received_bytes"] / 5
    hooked = e2e["DDP + DGC 0.1%"]  # our compressor as DDP's hook: its stats() over the timed steps
    assert hooked["way"] == "ddp" and hooked["horovod_twin"] == "DGC 0.1% allgather"
    assert "allgather" in hooked["exchanges"] and 0 < hooked["received_bytes"] < e2e["dense"]["received_bytes"] / 5
    assert results["trial"] == [] and "First steps of exchange=auto" not in md.read_text()
    assert results["hsdp"] == results["hsdp_convergence"] == [] and "Compressed HSDP" not in md.read_text()
    _check_the_hook_step(results["hook_step"], md.read_text())
    assert [r["method"] for r in results["convergence"]] == ["dense", "DGC 0.1%"]
    for r in results["convergence"]:  # each trained once per seed: the mean, and every seed's final
        assert r["seeds"] == [0, 1] and len(r["finals"]) == 2 and all(0 <= f <= 1 for f in r["finals"])
        assert r["final"] == sum(r["finals"]) / 2 and r["curve"] == [r["final"]]  # one epoch
        assert r["finals"][0] != r["finals"][1]  # the seeds differ: other weights, other data order
    data = results["convergence"][0]["data"]  # the data each record was trained on
    assert data["source"].startswith("scikit-learn ") and re.fullmatch(r"[0-9a-f]{64}", data["sha256"])
    assert all(r["data"] == data for r in results["convergence"])
    for figure in ("e2e_speedup.png", "convergence.png"):
        assert (tmp_path / "out" / figure).read_bytes()[:4] == b"\x89PNG"
    _check_the_tiny_page(tmp_path / "out", md.read_text(), results)


def test_report_rewrites_the_page_from_a_recorded_run_without_measuring(tmp_path):
    """`python -m benchmarks report`: the figures and the page again from a results.json
    (the repository's record), in the page's order, with no directory of the machine that made it."""
    root = ROOT
    out, md = tmp_path / "out", tmp_path / "results.md"
    out.mkdir()
    with open(os.path.join(root, "docs", "results", "results.json")) as f:
        recorded = json.load(f)
    recorded["command"] += f" --convergence-from {tmp_path}/earlier/results.json --out /elsewhere/results"
    (out / "results.json").write_text(json.dumps(recorded))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "report", "--out", str(out), "--results-md", str(md)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for figure in ("e2e_speedup.png", "convergence.png", "scaling.png"):
        assert (out / figure).read_bytes()[:4] == b"\x89PNG"
    text = md.read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[:3] == ["## Summary", "## Figures", "## End-to-end step time on an emulated network"]
    # short enough to scan: the run of record's page (under 200 lines, no line over 400 characters), and
    # each run added to it (until a full make bench records its rows) at most 45 lines more
    added = text.partition("### Runs added to the record")[2].partition("\n## ")[0]
    runs = added.count("\n`python -m benchmarks e2e ")
    assert headings[-1] == "## How it was measured" and len(text.splitlines()) - len(added.splitlines()) < 200
    assert len(added.splitlines()) < 45 * runs + 1 and max(map(len, text.splitlines())) <= 400
    assert "--convergence-from earlier/results.json --out results" in text
    assert str(tmp_path) not in text and "/elsewhere" not in text and "](out/results.json)" in text
    assert commit_hashes(text) == [] and not DATE.search(text)  # the record names its commits, the page none
    assert recorded["commit"] and commit_hashes(recorded["convergence_from"])
    assert "](out/e2e.csv)" in text and (out / "e2e.csv").read_text().startswith("model,method,")


def _check_the_hook_step(records, text):
    """`bench all`'s hook step, shrunk: a record per method and tensor count, each hook's step over
    DDP's allreduce step of the same round, its cost per tensor from its extra time at 161 and 16
    tensors; the page's paragraph with DDP's own step and cost per tensor, and each hook's."""
    text = text.replace("\n", " ")  # the paragraph, wrapped between words
    methods = ["DDP allreduce", "DGC 0.1%", "Threshold 1%", "TopK 1%", "DGC 0.1% spardl", "RandomBlock 1%"]
    assert [(r["method"], r["tensors"]) for r in records] == [(m, n) for n in (161, 16) for m in methods]
    by = {(r["method"], r["tensors"]): r for r in records}
    for r in records:
        base = by[("DDP allreduce", r["tensors"])]
        assert r["shapes"] == "small" and r["vs_allreduce"] == pytest.approx(r["step_ms"] / base["step_ms"])
        assert r["extra_ms"] == pytest.approx(r["step_ms"] - base["step_ms"])  # one step: its own round's
        extra_16 = by[(r["method"], 16)]["extra_ms"]
        assert r["us_per_tensor"] == pytest.approx((by[(r["method"], 161)]["extra_ms"] - extra_16) / 145 * 1e3)
    base, dgc = by[("DDP allreduce", 161)], by[("DGC 0.1%", 161)]
    own = (base["step_ms"] - by[("DDP allreduce", 16)]["step_ms"]) / 145 * 1e3
    assert f"161 matrices of 64x64: DDP's allreduce step {base['step_ms']:.1f} ms ({own:.0f} us a tensor); " in text
    assert f"DGC 0.1% {dgc['vs_allreduce']:.2f}x ({dgc['us_per_tensor']:+.0f} us)" in text
    assert "Timed by" not in text and "[hook_step.csv](out/hook_step.csv)" in text


def test_an_added_hook_step_run_stands_on_the_page_with_its_command(tmp_path):
    """`bench report --add-hook-step RUN.json`: the run's records replace the page's, in its paragraph
    (ResNet-50's layout, the page still under 200 lines) and in hook_step.csv (every layout), the run
    named without its commit."""
    from benchmarks import hook_step, report

    records = [
        dict(shapes=shapes, method=method, tensors=n, step_ms=step, vs_allreduce=step / base, extra_ms=step - base)
        for shapes in ("resnet50", "small")
        for n, base in ((161, 40.0), (16, 30.0))
        for method, step in (("DDP allreduce", base), ("DGC 0.1%", base * 1.5))
    ]
    for r in records:
        r["us_per_tensor"] = 0.0 if r["method"] == "DDP allreduce" else (20.0 - 15.0) / 145 * 1e3
    run = {"command": "python -m benchmarks hook-step --json hs.json", "commit": "0123abc", "records": records}
    results = report.with_hook_step_of(_recorded(), run, "hs.json")
    md = tmp_path / "results.md"
    report.write_markdown(results, str(tmp_path), str(md))
    text = md.read_text()
    assert len(text.splitlines()) < 200 and max(map(len, text.splitlines())) <= 400 and commit_hashes(text) == []
    text = text.replace("\n", " ")
    assert "ResNet-50's 161 shapes: DDP's allreduce step 40.0 ms (69 us a tensor); DGC 0.1% 1.50x (+34 us)." in text
    assert "161 matrices" not in text and "[hook_step.csv](./hook_step.csv)" in text
    assert "Timed by `python -m benchmarks hook-step --json hs.json`." in text
    with open(tmp_path / "hook_step.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == hook_step.CSV_HEADER and len(rows) == 1 + len(records)
    assert rows[2] == ["resnet50", "DGC 0.1%", "161", "60.00", "1.50", "20.00", "34.5"]


def _recorded():
    with open(os.path.join(ROOT, "docs", "results", "results.json")) as f:
        return json.load(f)


def _tables(text):
    """The markdown tables of `text`, each a list of rows of cells, its header first."""
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            tables.append(rows)
            rows = []
    return tables


ONE_FIGURE = re.compile(r"-|\*{0,2}[+-]?[\d,]+(\.\d+)?(x|%| pt)?\*{0,2}")  # 4.1x, 98.9%, 1.622, -0.1 pt, **0.93x**


def test_the_page_opens_with_a_headline_of_one_figure_a_cell_and_stays_short(tmp_path):
    """results.md: under 200 lines, none over 400 characters; first a headline table of at most 8
    columns, one figure a cell (4 ranks of the comm model: each method against dense and the fastest
    peer at 1 and 10 Gbit/s, its accuracy on each task), a paragraph on how to read it, then the
    figures; every other table at most 10 columns."""
    from benchmarks import report

    results, md = _recorded(), tmp_path / "results.md"
    report.write_markdown(results, str(tmp_path), str(md))
    text = md.read_text()
    assert len(text.splitlines()) < 200 and max(map(len, text.splitlines())) <= 400
    tables = _tables(text)
    header, *rows = tables[0]
    assert text.index("| method |") < text.index("## Figures") and len(header) <= report.HEADLINE_COLUMNS == 8
    assert header == [
        "method",
        "1 Gbit/s vs dense",
        "1 Gbit/s vs fastest peer (DDP fp16 hook)",
        "10 Gbit/s vs dense",
        "10 Gbit/s vs fastest peer (DDP fp16 hook)",
        "digits accuracy",
        "charlm loss",
        "wordlm loss",
    ]
    assert all(len(row) == len(header) and all(ONE_FIGURE.fullmatch(cell) for cell in row[1:]) for row in rows)
    shown = ("comm", 4, "per-host")  # not the 2x2 hosts' 4 ranks
    cell = {
        (r["method"], r["network"]): r for r in results["e2e"] if (r["model"], r["ranks"], r["network_model"]) == shown
    }
    dgc, peer = cell["DGC 0.1% allgather", "1gbit"], cell["DDP fp16", "1gbit"]
    row = next(row for row in rows if row[0] == "DGC 0.1% allgather")
    assert row[1:3] == [f"{dgc['vs_dense']:.1f}x", f"{peer['vs_floor'] / dgc['vs_floor']:.1f}x"]
    assert [row[0] for row in rows][:2] == ["dense", "DGC 0.1% allgather"] and len(rows) == 12
    said = text.partition("| DDP + RandomBlock 1% |")[2].partition("## Figures")[0]
    assert "How to read it: 4 ranks of the comm model" in said and "[summary.csv](" in said
    assert all(len(table[0]) <= 10 for table in tables[1:])
    many = dict(results, convergence=results["convergence"] + [dict(r, task="t4") for r in results["convergence"]])
    assert len(report._headline(many)[0]) == 8  # the tasks past 8 columns are left to the convergence table


def test_the_page_names_no_commit_and_no_date(tmp_path):
    """results.json keeps the commit of each run (of the run of record, of the runs that trained its
    convergence records, timed its first steps or added rows); the page names the commands alone."""
    from benchmarks import report

    results = dict(_recorded(), commit="abc1234", trial_from="`python -m benchmarks trial` on 1234abc")
    results["hsdp_from"] = "`python -m benchmarks hsdp` on 5678abc-dirty"
    trained = {"command": "python -m benchmarks convergence --seeds 0 1", "commit": "def5678"}
    results["convergence_from"] = report.convergence_source(trained, "c.json") + (
        '; the same with `--convergence-methods NAME` for "DGC 0.1% Nesterov" (e2e0774), "X" (7b3152f, all three tasks)'
    )
    run = {"command": "python -m benchmarks convergence --tasks digits", "commit": "0a1b2c3d"}
    results = report.with_convergence_added(results, dict(run, records=results["convergence"][:1]), "d.json")
    added = {"command": "python -m benchmarks e2e --models comm", "commit": "fedcba9-dirty", "minutes": 3.0}
    results = report.add_run(results, dict(added, records=_two_ways()))
    md = tmp_path / "results.md"
    report.write_markdown(results, str(tmp_path), str(md))
    text = md.read_text()
    assert commit_hashes(text) == [] and not DATE.search(text)
    assert [commit_hashes(results[key]) for key in ("commit", "convergence_from", "trial_from", "hsdp_from")] == [
        ["abc1234"],
        ["def5678", "e2e0774", "7b3152f", "0a1b2c3d"],
        ["1234abc"],
        ["5678abc"],
    ]
    words = " ".join(text.split())
    assert (
        "trained by another run (`python -m benchmarks convergence --seeds 0 1`; the same with "
        '`--convergence-methods NAME` for "DGC 0.1% Nesterov", "X" (all three tasks); 1 digits rows by '
        "`python -m benchmarks convergence --tasks digits`), not by this one." in words
    )
    assert (
        "Timed by `python -m benchmarks trial`." in words
        and "`python -m benchmarks e2e --models comm`, 3 minutes" in words
        and "Timed by `python -m benchmarks hsdp`." in words
    )


def test_the_wide_tables_are_written_as_csv_files_the_page_links(tmp_path):
    """Every column the page leaves out (the intervals, each cell's vs floor and exchange, every peer
    and rank count) is in a CSV file beside results.json, a table each, one header a column."""
    from benchmarks import report

    results, md, out = _recorded(), tmp_path / "results.md", tmp_path / "results"
    out.mkdir()
    (out / "added.csv").write_text("an earlier page's\n")  # this run has no added rows: removed
    report.write_markdown(results, str(out), str(md))
    text = md.read_text()

    def read(name):
        with open(out / name, newline="") as f:
            return list(csv.reader(f))

    names = ["summary", "e2e", "hosts", "auto", "phases", "ways", "convergence", "kernels", "scaling"]
    names += ["scaling_check", "scaling_hosts", "hsdp", "hsdp_convergence", "hook_step"]
    assert sorted(p.name for p in out.glob("*.csv")) == sorted(f"{name}.csv" for name in names)
    for name in names:
        header, *rows = read(f"{name}.csv")
        assert f"](results/{name}.csv)" in text and rows and len(set(header)) == len(header)
        assert all(len(row) == len(header) for row in rows)
    cells = [f"{n} ranks {net}" for n in (2, 4) for net in ("1 Gbit/s", "10 Gbit/s", "unshaped")]
    e2e = read("e2e.csv")
    assert e2e[0] == ["model", "method"] + [f"{c} {what}" for c in cells for what in report.E2E_FIGURES]
    r = next(r for r in results["e2e"] if (r["model"], r["ranks"], r["network"]) == ("comm", 2, "1gbit"))
    row = next(row for row in e2e if row[:2] == ["comm", r["method"]])
    assert row[2:7] == [
        f"{r['step_ms']:.1f}",
        ratio_text(r["vs_dense"], r["vs_dense_interval"]),
        ratio_text(r["vs_floor"], r["vs_floor_interval"]),
        f"{r['received_bytes'] / 1e6:.3f}",
        ", ".join(r["exchanges"]) or "-",
    ]
    assert len(e2e) - 1 == len({(r["model"], r["method"]) for r in results["e2e"] if r["ranks_per_host"] == 1})
    assert read("hosts.csv")[0][2:4] == ["2x2 1 Gbit/s ms/step", "2x2 1 Gbit/s vs dense"]
    assert read("auto.csv")[0] == list(report.AUTO_HEADER) and read("ways.csv")[0] == list(report.WAYS_HEADER)
    summary = read("summary.csv")[0]
    assert "2 ranks 1 Gbit/s vs DDP PowerSGD hook" in summary and "4 ranks unshaped vs Horovod fp16" in summary
    assert read("convergence.csv")[1][:2] == ["dense", "99.0% [98.6-99.4]"]
    assert len(read("kernels.csv")[0]) == 1 + 3 * 4 and len(read("kernels.csv")) == 1 + 21
    hsdp = read("hsdp.csv")  # every record of the HSDP run, with its intervals and the NIC's bytes
    assert hsdp[0] == list(report.HSDP_HEADER) and len(hsdp) == 1 + len(results["hsdp"])
    r = next(r for r in results["hsdp"] if (r["network"], r["method"]) == ("1gbit", "HSDP + DGC 0.1%"))
    assert hsdp[3][:8] == ["comm", "2x2", "1gbit", r["network_model"], r["method"], f"{r['step_ms']:.1f}"] + [
        ratio_text(r["vs_native"], r["vs_native_interval"]),
        ratio_text(r["vs_floor"], r["vs_floor_interval"]),
    ]
    conv = read("hsdp_convergence.csv")
    assert conv[0] == list(report.HSDP_CONVERGENCE_HEADER) and len(conv) == 1 + len(results["hsdp_convergence"])


def test_relative_command_names_no_directory_of_the_machine(tmp_path):
    from benchmarks.report import relative_command

    command = f"python -m benchmarks all --out {tmp_path}/docs/results --convergence-from /x/y/results.json"
    assert (
        relative_command(command, root=str(tmp_path))
        == "python -m benchmarks all --out docs/results --convergence-from results.json"
    )
    assert (
        relative_command("python -m benchmarks all --tasks 'DGC 0.1%'") == "python -m benchmarks all --tasks 'DGC 0.1%'"
    )


def test_the_charlm_corpus_names_its_files_and_hash():
    """The stdlib corpus differs between Python releases: its record says which text it was."""
    import hashlib
    import platform

    from benchmarks.convergence_worker import corpus

    text, data = corpus(limit=50_000)
    assert text.shape == (50_000,) and 0 <= int(text.min()) and int(text.max()) < 127
    assert data["sha256"] == hashlib.sha256(bytes(text.tolist())).hexdigest()
    assert data["source"].startswith(f"Python {platform.python_version()} standard library, __future__.py to ")
    assert corpus(limit=50_000)[1] == data and corpus(limit=60_000)[1]["sha256"] != data["sha256"]


def test_the_wordlm_corpus_is_gensims_wikipedia_sample_as_word_ids_by_count():
    """The articles as gensim reads them, then an independent count: ids rank the training
    words (the first 90%) by count, every other word is the last id."""
    import bz2
    import collections
    import hashlib

    import gensim
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki, tokenize

    from benchmarks.convergence_worker import WIKI_SAMPLE, WORD_VOCAB, word_corpus

    ids, data = word_corpus(limit=30_000)
    words = []
    with bz2.BZ2File(os.path.join(gensim.__path__[0], *WIKI_SAMPLE)) as f:
        for _, text, _ in extract_pages(f, filter_namespaces=("0",)):
            if len(words) < 30_000 and not text.lower().startswith("#redirect"):
                words += tokenize(filter_wiki(text), lower=True)
    words = words[:30_000]
    assert words[:6] == ["anarchism", "is", "political", "philosophy", "that", "advocates"]
    assert ids.shape == (30_000,) and data["sha256"] == hashlib.sha256(" ".join(words).encode()).hexdigest()
    assert data["source"].startswith(f"gensim {gensim.__version__} test data: Wikipedia, ")
    ranked = [w for w, _ in collections.Counter(words[:27_000]).most_common(WORD_VOCAB - 1)]
    first = {w: words.index(w) for w in ranked[:3] + ranked[-1:]}
    assert [int(ids[first[w]]) for w in first] == [0, 1, 2, len(ranked) - 1]
    known = set(ranked)
    assert int((ids == WORD_VOCAB - 1).sum()) == sum(w not in known for w in words) > 0


def test_a_language_model_task_evaluates_in_chunks_as_in_one_pass():
    import torch

    from benchmarks.convergence_worker import LanguageModelTask, loss_of

    task = LanguageModelTask("charlm", batch=4, rank=0, size=1, seed=0)
    task.valid = task.valid[:50]
    with torch.no_grad():
        whole = float(loss_of(task.model(task.valid[:, :-1]), task.valid[:, 1:]))
        assert task.evaluate(rows=7) == pytest.approx(whole, rel=1e-6)


def test_the_results_page_says_which_data_each_task_was_trained_on():
    from benchmarks import report

    a, b = {"source": "corpus A", "sha256": "a" * 64}, {"source": "corpus B", "sha256": "b" * 64}
    record = lambda task, data: {"task": task, **({"data": data} if data else {})}  # noqa: E731
    same = report._data_text([record("charlm", a), record("charlm", a)])
    assert same == f"- Data: charlm: corpus A, sha256 {'a' * 16}."
    assert report._data_text([record("digits", None)]) == "- Data: digits: not recorded by the run that trained it."
    mixed = report._data_text([record("charlm", a), record("charlm", b), record("digits", a)]).splitlines()
    assert mixed == [
        f"- Data: charlm: corpus A, sha256 {'a' * 16}; charlm: corpus B, sha256 {'b' * 16}; "
        f"digits: corpus A, sha256 {'a' * 16}.",
        "- **charlm's methods were not all trained on the same data**: compare them with care.",
    ]
    assert report._data_text([]) == ""


def test_rows_are_interleaved_in_groups_that_fit_in_memory():
    """Every row of every rank alive at once must fit in half the memory; else groups that each
    hold the floor and dense and as many other rows as fit; else one row at a time."""
    from benchmarks import e2e

    gib, rows = 2**30, ["floor", "dense", *(f"row {i}" for i in range(11))]
    assert e2e.interleaving("compute", 4, rows, 4, available=2 * gib) == (4, 0)  # 0.29M parameters a row
    assert e2e.interleaving("comm", 2, rows, 4, available=64 * gib) == (4, 0)  # 25.2M: 16 GB of rows
    assert e2e.rows_at_once("comm", 2, available=22 * gib) == 9  # 0.6 GB a row per rank
    assert e2e.interleaving("comm", 2, rows, 4, available=22 * gib) == (4, 9)
    assert e2e.interleaving("comm", 4, rows, 4, available=14 * gib) == (4, 3)  # the baselines and one more
    assert e2e.interleaving("comm", 4, rows, 4, available=12 * gib) == (1, 0)
    assert e2e.interleaving("comm", 2, rows, 1, available=64 * gib) == (1, 0)  # asked for one at a time


def test_groups_hold_the_baselines_beside_every_other_row():
    from benchmarks.e2e_worker import groups

    rows = ["floor", "dense", "a", "b", "c", "d", "e"]
    assert groups(rows, 7) == [rows]
    assert groups(rows, 4) == [["floor", "dense", "a", "b"], ["floor", "dense", "c", "d"], ["floor", "dense", "e"]]
    assert groups(["a", "dense", "b"], 2) == [["dense", "a"], ["dense", "b"]]
    with pytest.raises(ValueError, match="group_size: expected room for the baselines"):
        groups(rows, 2)


def test_rows_timed_in_groups_are_paired_with_their_own_groups_baselines(tmp_path):
    """The worker on 2 ranks, 4 rows in groups of 3: the floor and dense are timed in both groups
    (their records hold both groups' steps), every other row once, with the floor's and dense's
    steps of its own turns; the ratios pair those."""
    import statistics

    from launch import horovodrun_outcome

    from benchmarks import e2e, e2e_worker

    out = tmp_path / "records.json"
    rc, output, _ = horovodrun_outcome(
        2,
        e2e_worker.__file__,
        "--model",
        "compute",
        "--out",
        out,
        "--warmup",
        "1",
        "--steps",
        "3",
        "--rounds",
        "3",
        "--group-size",
        "3",
        "--first-steps",
        "2",
        "--methods",
        "floor",
        "dense",
        "DGC 0.1% spardl",
        "TopK 1%",
    )
    assert rc == 0, output[-3000:]
    records = json.loads(out.read_text())
    by = {r["method"]: r for r in records}
    assert [r["method"] for r in records] == ["floor", "dense", "DGC 0.1% spardl", "TopK 1%"]
    assert len(by["floor"]["step_times_ms"]) == len(by["dense"]["step_times_ms"]) == 6
    for method, group in (("DGC 0.1% spardl", 0), ("TopK 1%", 1)):
        row = by[method]
        assert len(row["step_times_ms"]) == 3 and set(row["baselines"]) == {"floor", "dense"}
        for baseline in ("floor", "dense"):  # its group's 3 steps of that baseline
            assert row["baselines"][baseline] == by[baseline]["step_times_ms"][3 * group : 3 * group + 3]
    assert "baselines" not in by["floor"] and "baselines" not in by["dense"]
    # our rows' host time in compress a step: a part of the step; Horovod's rows have no such counter
    assert all(0 < by[m]["compress_ms"] < by[m]["step_ms"] for m in ("DGC 0.1% spardl", "TopK 1%"))
    assert "compress_ms" not in by["dense"] and "compress_ms" not in by["floor"]
    # --first-steps 2: the rows with an exchange keep their first 2 (warm-up) steps; too few for a mean
    for method in ("DGC 0.1% spardl", "TopK 1%"):
        assert len(by[method]["first_steps_ms"]) == 2 and all(t > 0 for t in by[method]["first_steps_ms"])
        assert by[method]["first_steps_mean_ms"] == {}
    assert not any("first_steps_ms" in by[m] for m in ("floor", "dense"))
    e2e.add_ratios(records)
    topk, floor = by["TopK 1%"], by["floor"]["step_times_ms"][3:]
    assert topk["vs_floor"] == statistics.median(m / t for m, t in zip(topk["step_times_ms"], floor))
    # every step's phases, each on its slowest rank: none longer than the step (on its slowest
    # rank), together at least as long (the slowest rank of each phase may differ)
    for r in records:
        phases = r["phase_times_ms"]
        assert list(phases) == list(e2e_worker.PHASES) == ["forward", "backward", "step"]
        assert all(len(t) == len(r["step_times_ms"]) for t in phases.values())
        assert r["phases_ms"] == {name: statistics.median(t) for name, t in phases.items()}
        for i, step in enumerate(r["step_times_ms"]):
            parts = [t[i] for t in phases.values()]
            assert all(0 < part <= step * (1 + 1e-9) for part in parts) and sum(parts) >= step * (1 - 1e-9)


SYNCED_FLOOR_SCRIPT = """
import os, sys, time
import horovod.torch as hvd
import torch
from benchmarks.e2e_worker import Synced
hvd.init()
marker = sys.argv[1]
opt = Synced(torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.1))
if hvd.rank() == 1:  # late to the step: writes the marker, then steps
    time.sleep(1)
    open(marker, "w").close()
opt.step()
if hvd.rank() == 0:  # its step waited for rank 1's, which came after the marker
    assert os.path.exists(marker), "the synced step did not wait for rank 1"
print("rank", hvd.rank(), "ok")
"""


def test_the_synced_floor_waits_for_every_rank_before_its_step(tmp_path):
    """`floor synced`'s optimizer steps only once every rank has reached its step: rank 0 finds
    the marker rank 1 wrote (a second late) just before its own step. Ordered by the collective,
    not timed."""
    from launch import horovodrun_outcome

    script = tmp_path / "synced.py"
    script.write_text(SYNCED_FLOOR_SCRIPT)
    rc, output, _ = horovodrun_outcome(2, script, tmp_path / "marker")
    assert rc == 0 and output.count(" ok") == 2, output[-3000:]


def _per_host_or_skip():
    from benchmarks import network

    why = network.per_host_unavailable()
    if why is not None:
        pytest.skip(f"the per-host network model needs network namespaces, veths and tc (root): {why}")
    return network


def _namespaces():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_e2e_on_the_per_host_network_model_at_1gbit_and_cleans_up(tmp_path):
    """`bench e2e --network-model per-host`: 2 ranks, each in its own namespace with a 1 Gbit/s
    NIC, run the floor, the synced floor, dense, a local row and a DDP row, the records say so, and no namespace is
    left. The local row packs and unpacks on each rank alone: it counts what it would send, and
    receives nothing."""
    _per_host_or_skip()
    out = tmp_path / "e2e.json"
    methods = ["floor", "floor synced", "dense", "Threshold 1% local", "DDP fp16"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "e2e",
            "--network-model",
            "per-host",
            "--ranks",
            "2",
            "--networks",
            "1gbit",
            "--models",
            "compute",
            "--e2e-methods",
            *methods,
            "--warmup",
            "1",
            "--steps",
            "1",
            "--json",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, (stdout[-3000:], stderr[-3000:])
    records = json.loads(out.read_text())["records"]
    assert [r["method"] for r in records] == methods
    assert all(r["network_model"] == "per-host" and r["network"] == "1gbit" and r["ranks"] == 2 for r in records)
    assert all(r["vs_floor"] > 0 and r["vs_dense"] > 0 for r in records)
    assert records[1]["family"] == "floor" and records[1]["received_bytes"] == 0
    local = records[3]
    assert local["family"] == "local" and local["local_of"] == "Threshold 1%"
    assert local["sent_bytes"] > 0 and local["received_bytes"] == 0
    assert "per-host network model" in stdout and "vs floor" in stdout
    assert f"sparsecomm-{proc.pid}-" not in _namespaces()


def test_per_host_network_removes_its_namespaces_when_a_rank_fails():
    """Ranks that fail end the launch with an error, and every namespace of the network is
    deleted."""
    network = _per_host_or_skip()
    with pytest.raises(RuntimeError, match="per-host ranks failed"):
        with network.per_host("1gbit", 2) as hosts:
            names = [hosts.bridge, *hosts.hosts]
            assert all(name in _namespaces() for name in names)
            hosts.launch(2, "benchmarks.no_such_module", [], "[e2e]")
    assert not any(name in _namespaces() for name in names)


def test_per_host_network_of_2_hosts_of_2_ranks_keeps_a_host_off_its_nic(monkeypatch):
    """2 hosts x 2 ranks at 1 Gbit/s: Horovod sees the layout (local and cross ranks, one
    hostname per host), an allreduce inside a host sends almost nothing over the host's NIC and
    one over all 4 ranks sends the ring's cross-host share of it."""
    network = _per_host_or_skip()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([WORKERS, ROOT]))
    lines = []
    with network.per_host("1gbit", 2, ranks_per_host=2) as hosts:
        hosts.launch(4, "hosts_layout", [], "[layout]", log=lines.append)
    seen = {int(f["rank"]): f for f in (dict(zip(*[iter(line.split())] * 2)) for line in lines)}
    assert sorted(seen) == [0, 1, 2, 3], lines
    numel_bytes = 8_000_000
    for rank, f in seen.items():
        host = rank // 2
        assert (f["size"], f["local_size"], f["cross_size"]) == ("4", "2", "2"), f
        assert (int(f["local_rank"]), int(f["cross_rank"])) == (rank % 2, host), f
        assert f["host"] == network.PerHostNics.address(host), f
        assert float(f["local_sum"]) == sum(range(2 * host, 2 * host + 2)), f
        assert int(f["local_nic_bytes"]) < numel_bytes / 100, f  # Horovod's control messages only
        # a 4-rank ring sends 2 (N-1)/N of the tensor from every rank; half of its links leave the host
        assert int(f["every_nic_bytes"]) >= 1.5 * numel_bytes * 0.99, f


def test_e2e_on_2_hosts_of_2_ranks_where_hierarchical_halves_what_a_host_receives(tmp_path):
    """`bench e2e --ranks 4 --ranks-per-host 2`: one launch of 4 ranks in 2 host namespaces; the
    records and the table name the layout. What each host's NIC received a step, less Horovod's
    control messages: DGC 0.1% hierarchical at most half of the flat allgather's (measured over 4
    steps: 0.38-0.39, the other host's k pairs against 3 ranks' k). The control messages flow at a
    rate, not per step (each process set's controller coordinates every cycle, the cross sets'
    over the NIC), so they are taken off at the floor's rate times each row's step time: a slow
    step otherwise counts as many bytes (once 1.19 MB against the allgather's 0.44). The full comm
    model: comm-small's quarter of the pairs leaves that estimate's error no margin (0.62 once).
    Unshaped veths: a shaped link drops packets at its queue, and their resends count too."""
    _per_host_or_skip()
    for attempt in range(2):  # a slow spell in one row's 4 steps skews the control bytes taken off: once more
        rate, seconds, flat, hierarchical = _host_bytes(tmp_path / f"e2e{attempt}.json")
        if 0 < hierarchical <= 0.5 * flat:
            break
    assert 0 < hierarchical <= 0.5 * flat, (rate, seconds, flat, hierarchical)


def _host_bytes(out):
    """One `bench e2e` launch on 2 hosts of 2 ranks (floor, DGC 0.1% allgather and hierarchical):
    (the floor's NIC bytes a second, the rows' mean steps, the flat and hierarchical rows' NIC
    bytes less the control messages at the floor's rate)."""
    methods = ["floor", "DGC 0.1% allgather", "DGC 0.1% hierarchical"]
    command = [sys.executable, "-m", "benchmarks", "e2e", "--network-model", "per-host", "--ranks", "4"]
    command += ["--ranks-per-host", "2", "--networks", "unshaped", "--models", "comm", "--e2e-methods", *methods]
    proc = subprocess.run(
        command + ["--warmup", "1", "--steps", "4", "--json", str(out)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    records = json.loads(out.read_text())["records"]
    assert [r["method"] for r in records] == methods
    assert all(
        r["ranks"] == 4 and r["ranks_per_host"] == 2 and r["network_model"] == "per-host, hosts of 2" for r in records
    )
    assert "2 hosts of 2 ranks" in proc.stdout and re.search(r"comm\s+2x2\s+unshaped", proc.stdout), proc.stdout
    assert records[2]["exchanges"] == ["hierarchical"]
    seconds = [statistics.mean(r["step_times_ms"]) for r in records]
    rate = records[0]["nic_received_bytes"] / seconds[0]  # the floor exchanges nothing
    _, flat, hierarchical = (r["nic_received_bytes"] - rate * t for r, t in zip(records, seconds))
    return rate, seconds, flat, hierarchical


def test_a_layout_of_several_ranks_per_host_needs_the_per_host_model(monkeypatch, capsys):
    from benchmarks import network

    with pytest.raises(ValueError, match="ranks_per_host=2: needs the per-host model.*shared model"):
        with network.emulated("shared", None, 4, ranks_per_host=2):
            pass
    with pytest.raises(ValueError, match="ranks_per_host=2: .*got the per-host model and 3 ranks"):
        with network.emulated("per-host", None, 3, ranks_per_host=2):
            pass
    with pytest.raises(ValueError, match="ranks_per_host should be 1 to 64, got 0"):
        network.PerHostNics(2, None, ranks_per_host=0)
    code, said = refused(
        monkeypatch, capsys, "e2e", "--network-model", "shared", "--ranks", "4", "--ranks-per-host", "2"
    )
    assert code == 2 and "--ranks-per-host 2: needs the per-host network model, not shared" in said, said


def test_ratios_against_dense_and_floor_of_the_same_run():
    from benchmarks import e2e

    records = [
        {"method": "floor", "step_ms": 50.0},
        {"method": "dense", "step_ms": 200.0},
        {"method": "DDP PowerSGD", "step_ms": 100.0},
    ]
    e2e.add_ratios(records)
    assert [(r["vs_dense"], r["speedup_vs_dense"], r["vs_floor"]) for r in records] == [
        (4.0, 4.0, 1.0),
        (1.0, 1.0, 4.0),
        (2.0, 2.0, 2.0),
    ]
    alone = [{"method": "TopK 1%", "step_ms": 10.0}]
    e2e.add_ratios(alone)
    assert alone[0]["vs_dense"] is None and alone[0]["vs_floor"] is None


def test_rows_timed_in_turns_are_compared_step_by_step():
    """Interleaved rows: the median, over the turns, of the two rows' step ratio in the same turn.
    Here X is 10% slower than dense in 2 of 3 turns while the machine drifts 3x between turns:
    the paired ratio says 1.1x; the ratio of medians (what rows timed one at a time get) would
    say 0.75x, the drift's doing."""
    from benchmarks import e2e

    def row(method, times, rounds=3):
        return {"method": method, "rounds": rounds, "step_times_ms": times, "step_ms": statistics.median(times)}

    floor, dense, x = row("floor", [90, 270, 180]), row("dense", [100, 300, 200]), row("X", [110, 330, 150])
    e2e.add_ratios([floor, dense, x])
    assert x["vs_dense"] == x["speedup_vs_dense"] == 100 / 110 and x["vs_floor"] == 110 / 90
    assert dense["vs_dense"] == 1.0 and floor["vs_floor"] == 1.0
    one_at_a_time = [row("dense", [100, 300, 200], rounds=1), row("X", [110, 330, 150], rounds=1)]
    e2e.add_ratios(one_at_a_time)
    assert one_at_a_time[1]["vs_dense"] == 200 / 150
    assert x["vs_dense_interval"] is None  # 3 pairs: too few for a 95% interval
    uneven = [row("dense", [100, 300, 200]), row("X", [110, 330])]  # no pairs: the medians
    e2e.add_ratios(uneven)
    assert uneven[1]["vs_dense"] == 200 / 220 and uneven[1]["vs_dense_interval"] is None
    six = [row("dense", [100] * 6, rounds=6), row("X", [50, 80, 100, 100, 200, 400], rounds=6)]
    e2e.add_ratios(six)
    assert six[1]["vs_dense"] == 1.0 and six[1]["vs_dense_interval"] == [0.25, 2.0]  # 6 pairs: the extremes


def test_a_method_is_compared_with_its_kernels_alone_turn_by_turn():
    """vs_local: the method's per-turn ratio to the floor over its local row's, turn by turn, even
    where the two rows were timed in different groups (each against its own group's floor steps):
    here the machine drifts 2x between the groups and the method is 1.5x its local row in every
    turn but the last; the ratio of the two rows' medians would say 1.0x, the drift's doing."""
    from benchmarks import e2e

    floor = {"method": "floor", "rounds": 6, "step_times_ms": [100] * 6 + [200] * 6, "step_ms": 150.0}
    method = {
        "method": "T",
        "rounds": 6,
        "step_times_ms": [300] * 5 + [200],
        "step_ms": 300.0,
        "baselines": {"floor": [200] * 6},
    }  # timed with the second group's floor
    local = {
        "method": "T local",
        "rounds": 6,
        "local_of": "T",
        "step_times_ms": [100] * 6,
        "step_ms": 100.0,
        "baselines": {"floor": [100] * 6},
    }  # with the first group's
    e2e.add_ratios([floor, method, local])
    assert method["vs_floor"] == 1.5 and local["vs_floor"] == 1.0
    assert method["vs_local"] == 1.5 and method["vs_local_interval"] == [1.0, 1.5]  # 6 pairs: the extremes
    assert "vs_local" not in local and "vs_local" not in floor
    # timed one at a time: the ratio of the medians, no interval
    alone = [dict(r, rounds=1) for r in (floor, method, local)]
    e2e.add_ratios(alone)
    assert alone[1]["vs_local"] == 3.0 and alone[1]["vs_local_interval"] is None
    # no floor in the run: no ratio to it, none to the local row either
    without_floor = [{k: v for k, v in r.items() if not k.startswith("vs_")} for r in (method, local)]
    e2e.add_ratios(without_floor)
    assert without_floor[0]["vs_floor"] is None and "vs_local" not in without_floor[0]


def test_median_interval_covers_the_median_95_percent_of_the_time():
    """The order-statistics interval, against samples of a skewed distribution whose median is
    known (lognormal: 1): 16 pairs take the 4th and the 13th (both tails P(Binomial(16, 1/2) <= 3)
    = 1.06%: 97.9% coverage)."""
    import numpy as np

    from benchmarks.e2e import median_interval

    assert median_interval(list(range(16, 0, -1))) == [4, 13]
    assert median_interval(list(range(1, 101))) == [40, 61]
    assert median_interval([1, 2, 3, 4, 5]) is None
    rng = np.random.default_rng(0)
    covered = [lo <= 1 <= hi for lo, hi in (median_interval(list(rng.lognormal(0, 0.5, 16))) for _ in range(4000))]
    assert 0.97 <= np.mean(covered) <= 0.99


def test_results_page_says_whether_auto_is_within_3_percent_of_dense():
    """A cell with auto's row alone: auto against dense (vs_dense and its interval)."""
    from benchmarks import report

    cell = dict(
        model="compute",
        ranks=2,
        network="1gbit",
        network_model="per-host",
        method="DGC 0.1% auto",
        exchanges=["allgather", "dense"],
    )
    rows = report._auto_rows(
        [
            dict(cell, vs_dense=0.98, vs_dense_interval=[0.9, 1.05]),
            dict(cell, vs_dense=0.9, vs_dense_interval=[0.85, 0.99]),
            dict(cell, vs_dense=0.9, vs_dense_interval=[0.85, 0.95]),
            dict(cell, vs_dense=0.9, vs_dense_interval=None),
        ]
    )
    assert report.AUTO_HEADER[3:6] == ("vs dense", "vs the fastest route alone", "sent by")
    assert report.AUTO_HEADER[-1] == "verdict"
    assert rows[0] == (
        "compute",
        2,
        "1gbit (per-host)",
        "0.98x (0.90-1.05)",
        "0.98x (0.90-1.05) of dense",
        "allgather, dense",
        "-",
        "-",
        "-",
        "-",
        "within 3% of the fastest or faster",
    )
    assert rows[1][-1].endswith("not told apart from it")
    assert rows[2][-1] == "**slower than the fastest by more than 3%**"
    assert rows[3] == rows[2][:3] + ("0.90x", "0.90x of dense") + rows[2][5:]


def test_results_page_shows_auto_s_route_trial_and_its_hooks():
    """What auto's route trial kept and timed, as records have held it over time (one alternative,
    then one median pair, then a ratio per side), and the time of its compress hooks."""
    from benchmarks import report

    cell = dict(model="compute", ranks=2, network="1gbit", network_model="per-host", method="DGC 0.1% auto")
    tried = dict(
        cell,
        vs_dense=1.2,
        vs_dense_interval=[1.1, 1.3],
        exchanges=["allgather"],
        route_trial={"kept": "all sparse", "step_ms": {"model": 320.4, "all sparse": 255.9}},
    )
    assert report.AUTO_HEADER[5:9] == ("sent by", "route trial, ms a step", "median turn / model", "kept")
    assert report._auto_rows([tried])[0][5:] == (
        "allgather",
        "model 320, all sparse 256",
        "-",
        "all sparse",
        "-",
        "within 3% of the fastest or faster",
    )
    hooks = dict(tried, step_ms=250.0, compress_ms=2.5)  # host time in compress, recorded since this was added
    assert report.AUTO_HEADER[9] == "compress hooks, ms a step"
    assert report._auto_rows([hooks])[0][8:] == ("all sparse", "2.50 (1.0%)", "within 3% of the fastest or faster")
    paired = dict(tried, route_trial=dict(tried["route_trial"], ratio=0.8123, steps=24))  # recorded since the rounds
    assert report._auto_rows([paired])[0][6:] == (
        "model 320, all sparse 256",
        "0.81 over 24 steps",
        "all sparse",
        "-",
        "within 3% of the fastest or faster",
    )
    block = report._auto_block([paired], rel="results")  # the page: a paragraph, then auto's step a cell
    assert "within 3% or faster (0.97x or more) in 1 of 1 cells" in block and "kept all sparse in 1 cell." in block
    assert block.endswith("| model | ranks | 1 Gbit/s |\n|---|---|---|\n| compute | 2 | 1.20x |")
    assert "[auto.csv](results/auto.csv)" in block and report._auto_block([]) == ""
    both = dict(tried, route_trial=dict(tried["route_trial"], ratios={"all sparse": 0.8, "all dense": 1.1}, steps=36))
    assert report._auto_rows([both])[0][7] == "all sparse 0.80, all dense 1.10 over 36 steps"  # since both are tried


def _timed(method, times, dense_times, **more):
    """A comm-model record of 4 ranks unshaped, timed in turns beside dense (its baseline)."""
    return dict(
        model="comm",
        ranks=4,
        network="unshaped",
        network_model="per-host",
        method=method,
        exchanges=[],
        step_ms=statistics.median(times),
        step_times_ms=times,
        rounds=len(times),
        baselines={"dense": dense_times},
        **more,
    )


def test_auto_is_judged_against_the_fastest_of_its_routes_alone_paired_through_dense():
    """The cell's allgather row is the fastest: auto over it turn by turn, each turn through dense's
    step of its own turn (rows of different groups ran minutes apart), and the verdict on that,
    not on dense. A drift that doubles every step of a turn cancels. Where dense is the fastest,
    auto's vs_dense stands."""
    from benchmarks import e2e, report

    dense_times = [600.0, 1200.0, 610.0, 590.0, 1180.0, 605.0, 600.0, 595.0]
    drift = [t / 600 for t in dense_times]
    rows = [
        _timed("dense", dense_times, dense_times),
        _timed("DGC 0.1% allgather", [300 * d for d in drift], dense_times),
        _timed("DGC 0.1% spardl", [330 * d for d in drift], dense_times),
        _timed("DGC 0.1% auto", [321 * d for d in drift], dense_times, route_trial={}),
    ]
    e2e.add_ratios(rows)
    auto = rows[-1]
    fastest, speedup, interval = report._against_fastest(auto, rows)
    assert fastest == "allgather" and speedup == pytest.approx(300 / 321)
    assert interval == pytest.approx([300 / 321, 300 / 321])
    row = report._auto_rows(rows)[0]
    assert row[3] == "1.87x (1.87-1.87)" and row[4] == "0.93x (0.93-0.93) of allgather"
    assert row[-1] == "**slower than the fastest by more than 3%**"
    block = report._auto_block(rows)  # the page names the cell and sets its figure in bold
    assert "slower by more than 3% (bold) in 1 (comm 4 ranks unshaped 0.93x of allgather)." in block
    assert block.endswith("| comm | 4 | **0.93x** |")
    rows[1] = _timed("DGC 0.1% allgather", [315 * d for d in drift], dense_times)
    assert report._auto_rows(rows)[0][-1] == "within 3% of the fastest or faster"  # 0.98x
    slow_sparse = [r for r in rows if "allgather" not in r["method"] and "spardl" not in r["method"]]
    slow_sparse.append(_timed("DGC 0.1% spardl", [700 * d for d in drift], dense_times))
    assert report._against_fastest(auto, slow_sparse)[0] == "dense"


def test_turns_give_every_row_its_steps_paired_by_index_and_rotate_the_order():
    from benchmarks.e2e_worker import turns

    order = list(turns("abc", steps=7, rounds=3))
    assert order == [("a", 2), ("b", 2), ("c", 2), ("b", 2), ("c", 2), ("a", 2), ("c", 3), ("a", 3), ("b", 3)]
    assert list(turns("ab", steps=4, rounds=1)) == [("a", 4), ("b", 4)]


def test_a_failed_rank_ends_the_others():
    """One rank exits with an error: the launcher kills the rank still running (it would wait
    for its peer forever) instead of hanging."""
    from benchmarks import network

    read, write = os.pipe()
    procs = [subprocess.Popen(["sleep", "60"], stdout=write), subprocess.Popen(["false"], stdout=write)]
    os.close(write)
    started = time.time()
    with open(read) as stream:
        network._follow(procs, stream, "[e2e]", print)
    assert time.time() - started < 10 and procs[0].wait() != 0 and procs[1].wait() == 1


def test_results_page_sets_each_method_beside_its_kernels_alone():
    """A method's vs floor and its local row's, per comm cell, in the end-to-end table; the
    method over its local row where measured, in the phase table, and nothing where a cell has no
    local row."""
    from benchmarks import report

    cell = dict(
        model="comm", ranks=2, network="1gbit", network_model="per-host", step_ms=100.0, received_bytes=0, exchanges=[]
    )
    records = [
        dict(cell, method="floor", family="floor", vs_floor=1.0),
        dict(cell, method="Threshold 1%", family="sparsecomm", vs_floor=1.37, vs_floor_interval=[1.08, 1.66]),
        dict(
            cell,
            method="Threshold 1% local",
            family="local",
            local_of="Threshold 1%",
            vs_floor=1.21,
            vs_floor_interval=[1.1, 1.3],
        ),
    ]
    header, rows = report._e2e_wide(records)  # e2e.csv
    assert header == ["model", "method"] + [f"2 ranks 1 Gbit/s {what}" for what in report.E2E_FIGURES]
    assert rows[1:] == [
        ["comm", "Threshold 1%", "100.0", "-", "1.37x (1.08-1.66)", "0.000", "-"],
        ["comm", "Threshold 1% local", "100.0", "-", "1.21x (1.10-1.30)", "0.000", "-"],
    ]
    assert [row[0] for row in report._step_table(records)[1]] == ["floor", "Threshold 1%"]  # the page: no local row
    assert report._phase_rows(records[:2]) == (["ranks", "network"], []) and report._phase_text(records[:2], "r") == ""
    records[1].update(vs_local=1.13, vs_local_interval=[0.98, 1.3])
    assert report._phase_rows(records) == (
        ["ranks", "network", "Threshold 1% over kernels alone"],
        [("2", "1gbit", "1.13x (0.98-1.30)")],
    )
    assert "its exchange adds: Threshold 1% 1.13x." in report._phase_text(records, "results")


def test_results_page_shows_where_the_step_goes_for_the_floor_and_each_local_row_and_its_method():
    """The phase table: per comm cell (hosts of several ranks by their layout), the floor, each
    local row and the method it is of (not the other rows), where the phases were timed; nothing
    for records without them (older runs). Their ms/step is in the end-to-end table."""
    from benchmarks import report

    cell = dict(model="comm", ranks=2, network="1gbit", network_model="per-host", received_bytes=0, exchanges=[])

    def row(method, family, step, **extra):
        return dict(
            cell,
            method=method,
            family=family,
            step_ms=step,
            vs_floor=1.0,
            phases_ms={"forward": step / 4, "backward": step / 2, "step": step / 4},
            **extra,
        )

    records = [
        row("floor", "floor", 200.0),
        row("dense", "horovod", 1000.0),
        row("T", "sparsecomm", 260.0),
        row("T local", "local", 240.0, local_of="T"),
        dict(row("compute floor", "floor", 300.0), model="compute"),
        dict(row("floor", "floor", 400.0), ranks=4, network_model="per-host, hosts of 2"),
    ]
    assert report._phase_rows(records) == (
        ["ranks", "network", *(f"{m} {p}" for m in ("floor", "T local", "T") for p in ("forward", "backward", "step"))],
        [
            ("2", "1gbit", "50.0", "100.0", "50.0", "60.0", "120.0", "60.0", "65.0", "130.0", "65.0"),
            ("2x2", "1gbit", "100.0", "200.0", "100.0", *["-"] * 6),  # a layout of hosts, named as one
        ],
    )
    wide = {(row[0], row[1]): row[2:] for row in report._e2e_wide(records)[1]}
    assert [wide["comm", m][0] for m in ("floor", "T local", "T")] == ["200.0", "240.0", "260.0"]
    assert "**Where a step's time goes**" in report._phase_text(records, "results")
    older = [{k: v for k, v in r.items() if k != "phases_ms"} for r in records]
    assert report._phase_rows(older)[1] == [] and report._phase_text(older, "results") == ""


def test_reused_convergence_records_name_the_run_that_trained_them():
    """Reused records keep naming the run that trained them, however many runs reuse them in
    turn (each reuse once named only the run before it), and the page says so."""
    from benchmarks import report

    trained = {"command": "python -m benchmarks all", "commit": "abc1234", "convergence": []}
    assert report.convergence_source(trained, "a.json") == "`python -m benchmarks all` on abc1234"
    first_reuse = {
        "command": "python -m benchmarks all --convergence-from a.json",
        "commit": "def5678",
        "convergence_from": report.convergence_source(trained, "a.json"),
    }
    assert report.convergence_source(first_reuse, "b.json") == "`python -m benchmarks all` on abc1234"
    assert report.convergence_source({"convergence": []}, "old.json") == "old.json"  # neither command nor commit
    said = report._reused(first_reuse)  # the page names the command that trained them, not its commit
    assert (
        said == "These convergence records were trained by another run (`python -m benchmarks all`), not by this one."
    )
    assert commit_hashes(said) == [] and report._reused({"commit": "def5678"}) == ""
    recorded = (
        '`a` on 219ef1c; for "X" (e2e0774), "Y" (7b3152f, all three tasks), `b` on 0a1b2c3-dirty, z (v1.0-3-gabc1234)'
    )
    assert report.without_commits(recorded) == '`a`; for "X", "Y" (all three tasks), `b`, z'
    assert report.without_commits("`a` on None, 25557032 floats, deadbeef") == "`a`, 25557032 floats, deadbeef"
    if os.path.isdir(os.path.join(ROOT, ".git")):  # a checkout (CI: a fresh clone)
        assert re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", report.code_version())


def test_ddp_hook_rows_run_their_horovod_rows_compressor_with_what_the_hook_carries():
    """Each DDP + row is a row of the worker and of `bench e2e --e2e-methods`, and runs the
    compressor and optimizer momentum of a Horovod row whose settings the DDP hook carries (no
    spardl, no quantize)."""
    from benchmarks.__main__ import _parser
    from benchmarks.e2e_worker import DDP_HOOK_ROWS, METHODS, ROWS, model_and_batch

    assert list(DDP_HOOK_ROWS) == ["DDP + DGC 0.1%", "DDP + Threshold 1%", "DDP + TopK 1%", "DDP + RandomBlock 1%"]
    assert ROWS[-len(DDP_HOOK_ROWS) :] == tuple(DDP_HOOK_ROWS)
    assert _parser().parse_args(["e2e", "--e2e-methods", *DDP_HOOK_ROWS]).methods == list(DDP_HOOK_ROWS)
    model = model_and_batch("compute")[0]
    for name, twin in DDP_HOOK_ROWS.items():
        assert name == "DDP + " + twin.removesuffix(" allgather")
        compression = METHODS[twin][0](model, None)
        assert getattr(compression, "exchange", "shared") != "spardl" and compression.method.bits is None
        assert compression.process_set is None and isinstance(compression.stats()["sent_bytes"], int)
    assert [METHODS[t][1] for t in DDP_HOOK_ROWS.values()] == [0, 0.9, 0.9, 0]  # DGC, RandomBlock: plain SGD


def _two_ways(network="1gbit"):
    """A comm cell's records with DGC through Horovod and as DDP's hook, both paired with the floor."""
    from benchmarks.e2e import add_ratios

    cell = dict(model="comm", ranks=2, network=network, network_model="per-host", rounds=2, exchanges=[])

    def row(method, family, steps, received=0.0, phases=(10.0, 100.0, 5.0), **extra):
        return dict(
            cell,
            method=method,
            family=family,
            step_times_ms=steps,
            step_ms=sum(steps) / 2,
            received_bytes=received,
            phases_ms=dict(zip(("forward", "backward", "step"), phases)),
            baselines={"floor": [100.0, 100.0]},
            **extra,
        )

    records = [
        row("floor", "floor", [100.0, 100.0]),
        row("dense", "horovod", [800.0, 800.0], 100e6),
        dict(row("DGC 0.1% allgather", "sparsecomm", [130.0, 130.0], 0.24e6, (10, 60, 60)), exchanges=["allgather"]),
        row("DDP PowerSGD", "ddp", [450.0, 450.0], 0.33e6),
        dict(
            row("DDP + DGC 0.1%", "sparsecomm", [117.0, 117.0], 0.6e6, (10, 100, 7)),
            exchanges=["allgather"],
            way="ddp",
            horovod_twin="DGC 0.1% allgather",
        ),
    ]
    add_ratios(records)
    return records


def test_results_page_sets_each_ddp_hook_row_beside_its_horovod_row():
    """The Horovod or DDP table: per comm cell and method timed both ways, each way's step and vs
    floor, the DDP row over the Horovod row (paired through the floor), against DDP PowerSGD, the
    MB received and the phases; and a passage that says which way is faster and why, from them."""
    from benchmarks import report

    records = _two_ways()
    assert report._ways_rows(records) == [
        (
            2,
            "1gbit",
            "DGC 0.1%",
            "130.0",
            "1.30x",
            "117.0",
            "1.17x",
            "0.90x",
            "3.85x",
            "0.240 / 0.600",
            "60 + 60 / 100 + 7",
        )
    ]
    block = " ".join(report._ways_block(records).split())  # its passage, unwrapped
    assert "**Horovod or DDP** (comm model)" in block and "DDP hook / Horovod below 1.00x: the hook is faster" in block
    assert report.WAYS_HEADER[7] == "DDP hook / Horovod" and len(set(report.WAYS_HEADER)) == len(report.WAYS_HEADER)
    assert "[ways.csv](results/ways.csv)" in report._ways_block(records, "results")
    assert "DDP's hook in 1 of 1 pairs (DGC 0.1% at 2 ranks 1gbit 0.90x). Where the interval" in block
    assert "in the optimizer's step (60 ms, decompress included)" in block and "update alone (7 ms)" in block
    assert "compress and unpack: it is 40 ms longer than Horovod's" in block
    assert "it receives 2.50x the MB of Horovod's allgather, 2.9 ms a step at the shaped rates" in block
    slower = dict(step_ms=140.0, step_times_ms=[140.0, 140.0])  # paired through the floor, turn by turn
    lost = [dict(r, **slower) if r["method"] == "DDP + DGC 0.1%" else r for r in records]
    lost += [dict(r, network="10gbit") for r in records]  # another cell, where the hook wins
    text = " ".join(report._ways_text(lost).split())
    assert (
        "DDP's hook in 1 of 2 pairs (DGC 0.1% at 2 ranks 10gbit 0.90x); "
        "Horovod in the other 1, by 1.08x (median 1.08x)." in text
    )
    assert report._ways_block(records[:4]) == "" and report._trained_as("DDP + DGC 0.1%", {"DGC 0.1%"}) == "DGC 0.1%"


def test_an_e2e_run_is_added_to_the_record_apart_and_replaces_an_earlier_one_of_its_cells(tmp_path):
    """`bench report --add-e2e RUN.json`: the run's records go under e2e_added, shown in a table of
    their own after the run of record's (their ratios against their own baselines), in the figure
    where the run of record lacks the row; a later run of the same cells replaces it."""
    from benchmarks import report

    main = [dict(r, network_model="per-host") for r in _two_ways()[:2]]
    results = {"e2e": main}
    run = {"command": "python -m benchmarks e2e --models comm", "commit": "abc1234", "minutes": 7.2}
    results = report.add_run(results, dict(run, records=_two_ways()))
    results = report.add_run(results, dict(run, records=_two_ways("10gbit")))
    assert [r["records"][0]["network"] for r in results["e2e_added"]] == ["1gbit", "10gbit"]
    results = report.add_run(results, dict(run, commit="def5678", records=_two_ways()))  # the 1gbit cell again
    assert [(r["commit"], r["records"][0]["network"]) for r in results["e2e_added"]] == [
        ("abc1234", "10gbit"),
        ("def5678", "1gbit"),
    ]
    assert results["e2e"] == main
    shown = report.figure_records(results)
    assert len(shown) == 2 + 5 + 3 and [r["method"] for r in shown[:2]] == ["floor", "dense"]
    block = report._added_block(results, "results")
    assert block.startswith("### Runs added to the record\n") and "[added.csv](results/added.csv)" in block
    assert "`python -m benchmarks e2e --models comm`, 7 minutes" in block and commit_hashes(block) == []
    assert "**comm model, 2 ranks, 1 Gbit/s (per-host)**" in block  # a narrow table a cell
    assert "| DDP + DGC 0.1% | 117.0 | 6.84x | 1.17x | 0.600 | allgather |" in block
    assert block.count("**Horovod or DDP**") == 2 and report._added_block({"e2e": main}) == ""
    header, rows = report._added_wide(results)  # added.csv: each run's e2e.csv rows after its number and command
    assert header[:4] == ["run", "command", "model", "method"] and [row[0] for row in rows] == [1] * 5 + [2] * 5
    assert rows[-1][:4] == [2, run["command"], "comm", "DDP + DGC 0.1%"] and "6.84x" in rows[-1]


def test_seeds_merge_into_the_mean_with_every_final_and_a_diverged_seed_shortens_the_curve():
    from benchmarks.convergence import final_text, merged

    def record(method, seed, curve, metric="val_loss"):
        return dict(task="charlm", method=method, seed=seed, metric=metric, curve=curve, final=curve[-1])

    one, two = record("TopK 1%", 0, [2.0, 1.5, 1.25]), record("TopK 1%", 1, [2.5, float("inf")])
    dense = record("dense", 0, [2.0, 1.0])
    out = merged([dense, one, two])
    assert out[0] is dense  # one seed: the record as it was
    topk = out[1]
    assert topk["seeds"] == [0, 1] and topk["finals"] == [1.25, float("inf")] and topk["final"] == float("inf")
    assert topk["curve"] == [2.25, float("inf")]  # as long as the shortest seed's
    assert merged([one, record("TopK 1%", 1, [2.0, 1.5, 1.75])])[0]["final"] == 1.5
    assert final_text(merged([one, record("TopK 1%", 1, [2.0, 1.5, 1.75])])[0], dense) == "1.500 [1.250-1.750] (+50.0%)"
    accuracy = merged([record("a", 0, [0.5], "accuracy"), record("a", 1, [0.75], "accuracy")])[0]
    assert final_text(accuracy, dict(final=0.5)) == "62.5% [50.0-75.0] (+12.5 pt)"


def test_every_convergence_row_warms_up_its_learning_rate_linearly():
    import torch

    from benchmarks.convergence_worker import warmed_up

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    schedule, seen = warmed_up(opt, 4), []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
    assert seen == [0.125, 0.25, 0.375, 0.5, 0.5, 0.5]


def report_with_run(tmp_path, out, md, option, *runs):
    """`bench report` of the results in `out` with `option` naming `runs` (each written to a file, in
    their order): the results.json it writes."""
    paths = []
    for i, run in enumerate(runs):
        paths.append(str(tmp_path / f"run{i or ''}.json"))
        (tmp_path / os.path.basename(paths[-1])).write_text(json.dumps(run))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "report", "--out", str(out), "--results-md", str(md), option, *paths],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


def test_report_takes_the_convergence_records_of_a_convergence_run(tmp_path):
    """`bench report --convergence-from RUN.json` puts a `bench convergence --json` run's records
    into results.json and the page: each method's mean, the range over its seeds, and the run
    that trained them."""
    import shutil

    out, md = tmp_path / "out", tmp_path / "results.md"
    shutil.copytree(os.path.join(ROOT, "docs", "results"), out)
    schedule = dict(lr=0.05, warmup_epochs=4, clip_norm=None)
    common = dict(task="digits", metric="accuracy", dense_bytes_per_step=4e5, schedule=schedule, epochs=1)
    records = [
        dict(common, method="dense", seeds=[0, 1], finals=[0.99, 0.98], final=0.985, curve=[0.985]),
        dict(common, method="TopK 1%", seeds=[0, 1], finals=[0.97, 0.98], final=0.975, curve=[0.975]),
    ]
    records[0]["sent_bytes_per_step"], records[1]["sent_bytes_per_step"] = 4e5, 2e4
    run = dict(command="python -m benchmarks convergence --seeds 0 1", commit="abc1234", records=records)
    results = report_with_run(tmp_path, out, md, "--convergence-from", run)
    assert results["convergence"] == records
    assert results["convergence_from"] == "`python -m benchmarks convergence --seeds 0 1` on abc1234"
    text = md.read_text()
    assert "| TopK 1% | 97.5% | -1.0 pt | 20x |" in text  # the mean; the range over the seeds in convergence.csv
    assert "\nTopK 1%,97.5% [97.0-98.0],-1.0 pt,20x\n" in (out / "convergence.csv").read_text()
    assert "trained by another run (`python -m benchmarks convergence --seeds 0 1`), not by this one" in text
    assert commit_hashes(text) == []  # results.json names the commit, the page does not
    assert "once per seed (0, 1:" in " ".join(text.split())


def test_report_adds_a_convergence_runs_records_beside_the_others(tmp_path):
    """`bench report --add-convergence RUN.json`: the run's record of a task and method takes the
    place of the earlier one, a new task's records come after the rest, every other record stays,
    and the page names both runs."""
    import shutil

    out, md = tmp_path / "out", tmp_path / "results.md"
    shutil.copytree(os.path.join(ROOT, "docs", "results"), out)
    before = json.loads((out / "results.json").read_text())
    first = before["convergence"][0]  # digits, dense
    schedule = dict(lr=0.5, warmup_epochs=1, clip_norm=1.0)
    common = dict(metric="val_loss", dense_bytes_per_step=4e6, schedule=schedule, epochs=1, seed=0)
    added = [
        dict(first, final=0.5, curve=[0.5]),
        dict(common, task="newlm", method="dense", final=5.2, curve=[5.2], sent_bytes_per_step=4e6),
        dict(common, task="newlm", method="TopK 1%", final=5.3, curve=[5.3], sent_bytes_per_step=1e5),
    ]
    run = dict(command="python -m benchmarks convergence --tasks digits newlm", commit="abc1234", records=added)
    results = report_with_run(tmp_path, out, md, "--add-convergence", run)
    assert results["convergence"] == [added[0], *before["convergence"][1:], added[1], added[2]]
    source = f"{before['convergence_from']}; 3 digits/newlm rows by `{run['command']}` on abc1234"
    assert results["convergence_from"] == source
    text = md.read_text()
    assert "| dense | 50.0% " in text and "| TopK 1% | " in text and "5.300" in text
    words = " ".join(text.split())
    assert f"3 digits/newlm rows by `{run['command']}`), not by this one" in words and commit_hashes(text) == []


def _hsdp_run(network="1gbit", dgc_ms=120.0, commit="abc1234"):
    """A small `bench hsdp --json` run of one cell (2 hosts of 2 ranks): the floor, native HSDP and
    DGC, their ratios by benchmarks.hsdp.add_ratios, as the bench adds them."""
    from benchmarks import hsdp

    common = dict(model="comm", ranks=4, ranks_per_host=2, network=network, network_model="per-host, hosts of 2")
    rows = [("floor", 100.0, 0.0), ("native HSDP", 900.0, 100.7e6), ("HSDP + DGC 0.1%", dgc_ms, 0.2356e6)]
    records = [dict(common, method=m, step_ms=ms, host_sent_bytes=sent, nic_sent_bytes=sent) for m, ms, sent in rows]
    hsdp.add_ratios(records)
    return dict(command=f"python -m benchmarks hsdp --networks {network}", commit=commit, minutes=3.7, records=records)


def _hsdp_convergence_run(dgc_finals=(0.97, 0.99), commit="def5678"):
    """A small `bench hsdp-convergence --json` run: native HSDP and DGC on digits, 2 seeds each."""

    def row(method, finals, stats=None):
        return dict(
            task="digits", method=method, ranks=4, replicas=2, metric="accuracy", epochs=30, seed=None, seeds=[0, 1]
        ) | dict(finals=list(finals), final=sum(finals) / 2, curve=[sum(finals) / 2], stats=stats)

    records = [
        row("native HSDP", (0.99, 0.99)),
        row("HSDP + DGC 0.1%", dgc_finals, dict(dense_bytes=4e6, sent_bytes=2e5)),
    ]
    return dict(command="python -m benchmarks hsdp-convergence", commit=commit, minutes=4.5, records=records)


def _without_hsdp(results):
    return {k: v for k, v in results.items() if not k.startswith("hsdp")}


def test_the_page_sets_compressed_hsdp_beside_the_hosts_rows_and_its_records_in_csv_files(tmp_path):
    """Compressed HSDP's rows, from a small results.json: after the hosts of several ranks, one table
    a row per HSDP row (its step, vs native and vs floor at 1 and 10 Gbit/s, the MB a host sends, its
    digits accuracy and the change against native HSDP's), the runs that made them without their
    commits; every record, with the intervals and each seed, in hsdp.csv and hsdp_convergence.csv."""
    from benchmarks import report

    out, md = tmp_path / "results", tmp_path / "results.md"
    out.mkdir()
    results = _without_hsdp(_recorded())
    for key, run in (("hsdp", _hsdp_run()), ("hsdp", _hsdp_run("10gbit", 950.0)), ("hsdp_convergence", None)):
        results = report.with_hsdp_added(results, key, run or _hsdp_convergence_run(), "run.json")
    (out / "results.json").write_text(json.dumps(results))
    report.write_markdown(json.loads((out / "results.json").read_text()), str(out), str(md))
    text = md.read_text()
    section = text.partition("**Compressed HSDP**")[2].partition("**exchange=")[0]
    assert text.index("**Hosts of several ranks**") < text.index("**Compressed HSDP**") < text.index("## First steps")
    (table,) = _tables(section)
    assert table == [
        ["row", "1 Gbit/s ms/step", "1 Gbit/s vs native", "1 Gbit/s vs floor", "10 Gbit/s ms/step"]
        + ["10 Gbit/s vs native", "10 Gbit/s vs floor", "host MB", "digits accuracy", "vs native"],
        ["floor", "100.0", "9.00x", "1.00x", "100.0", "9.00x", "1.00x", "0.000", "-", "-"],
        ["native HSDP", "900.0", "1.00x", "9.00x", "900.0", "1.00x", "9.00x", "100.700", "99.0%", "+0.0 pt"],
        ["HSDP + DGC 0.1%", "120.0", "7.50x", "1.20x", "950.0", "0.95x", "9.50x", "0.236", "98.0%", "-1.0 pt"],
    ]
    words = " ".join(section.split())
    assert "on 2 hosts of 2 ranks, one NIC a host (per-host network)" in words and "mean over seeds 0, 1" in words
    assert (
        "Timed by `python -m benchmarks hsdp --networks 1gbit`; 3 rows by `python -m benchmarks hsdp --networks"
        in words
    )
    assert "Trained by `python -m benchmarks hsdp-convergence`." in words and commit_hashes(section) == []
    assert "[hsdp.csv](results/hsdp.csv), [hsdp_convergence.csv](results/hsdp_convergence.csv)" in words
    assert len(text.splitlines()) < 200 and max(map(len, text.splitlines())) <= 400
    hsdp = (out / "hsdp.csv").read_text().splitlines()
    assert hsdp[3] == 'comm,2x2,1gbit,"per-host, hosts of 2",HSDP + DGC 0.1%,120.0,7.50x,1.20x,0.236,0.236,1.9,101.9'
    conv = (out / "hsdp_convergence.csv").read_text().splitlines()
    assert conv[2] == 'digits,2x2,HSDP + DGC 0.1%,30,98.0% [97.0-99.0],"0: 97.0%, 1: 99.0%",-1.0 pt,20x'
    report.write_markdown(_without_hsdp(results), str(out), str(md))  # a run without them: no section, no files
    assert "Compressed HSDP" not in md.read_text() and not list(out.glob("hsdp*.csv"))


def test_report_adds_hsdp_runs_in_place_of_the_cells_and_rows_they_cover(tmp_path):
    """`bench report --add-hsdp RUN.json` and `--add-hsdp-convergence RUN.json`: the run's records
    take the place of those of the cells (a network's launch) or rows they cover, the others kept;
    hsdp_from and hsdp_convergence_from name every run, the page none of their commits."""
    import shutil

    out, md = tmp_path / "out", tmp_path / "results.md"
    shutil.copytree(os.path.join(ROOT, "docs", "results"), out)
    (out / "results.json").write_text(json.dumps(dict(_without_hsdp(_recorded()), hsdp=[], hsdp_convergence=[])))
    again = _hsdp_run(dgc_ms=150.0, commit="fed9876")  # the 1 Gbit/s cell again: it replaces the first run's
    results = report_with_run(tmp_path, out, md, "--add-hsdp", _hsdp_run(), _hsdp_run("10gbit"), again)
    assert results["hsdp"] == _hsdp_run("10gbit")["records"] + again["records"]
    assert results["hsdp_from"] == (
        "`python -m benchmarks hsdp --networks 1gbit` on abc1234; 3 rows by `python -m benchmarks hsdp --networks "
        "10gbit` on abc1234; 3 rows by `python -m benchmarks hsdp --networks 1gbit` on fed9876"
    )
    assert "| HSDP + DGC 0.1% | 150.0 | 6.00x | 1.50x | 120.0 | 7.50x | 1.20x | 0.236 |" in md.read_text()
    retrained = _hsdp_convergence_run((0.9, 0.92), "0a1b2c3")
    retrained["records"] = retrained["records"][1:]  # DGC's row alone
    results = report_with_run(tmp_path, out, md, "--add-hsdp-convergence", _hsdp_convergence_run(), retrained)
    assert results["hsdp_convergence"] == _hsdp_convergence_run()["records"][:1] + retrained["records"]
    assert results["hsdp_convergence_from"] == (
        "`python -m benchmarks hsdp-convergence` on def5678; 1 rows by `python -m benchmarks hsdp-convergence` on "
        "0a1b2c3"
    )
    assert results["hsdp"] == _hsdp_run("10gbit")["records"] + again["records"]  # kept
    text = md.read_text()
    assert "| 91.0% | -8.0 pt |" in text and commit_hashes(text) == []


def test_bench_all_runs_hsdp_on_the_per_host_model_alone_and_may_reuse_its_convergence_rows(monkeypatch, capsys):
    """`bench all`'s compressed HSDP rows: `bench hsdp` on 2 hosts of 2 ranks at --host-networks with its
    own 16 steps, none on the shared network model (it would shape the traffic inside a host); `bench
    hsdp-convergence` with --seeds and --epochs, or the rows of --convergence-from's results.json."""
    from benchmarks import __main__ as bench
    from benchmarks import report

    ran = []
    monkeypatch.setattr(bench.hsdp, "run", lambda args: ran.append(args) or [{"method": "floor"}])
    monkeypatch.setattr(bench.hsdp_convergence, "run", lambda args: ran.append(args) or [{"method": "native HSDP"}])
    args = bench._parser().parse_args(["all", "--epochs", "2", "--seeds", "3"])
    args.host_networks, args.network_model = ["1gbit", None], "per-host"  # as main() leaves them
    assert bench._hsdp(args) == [{"method": "floor"}] and bench._hsdp_convergence(args, report) == (
        [{"method": "native HSDP"}],
        None,
    )
    step, trained = ran
    assert (step.hosts, step.ranks_per_host, step.networks, step.steps, step.model) == (
        2,
        2,
        ["1gbit", "unshaped"],
        16,
        "comm",
    )
    assert (trained.hosts, trained.ranks_per_host, trained.epochs, trained.seeds) == (2, 2, 2, [3])
    assert list(step.methods) == list(bench.hsdp.ROWS) and list(trained.methods) == list(bench.hsdp_convergence.ROWS)
    args.network_model = "shared"
    assert bench._hsdp(args) == [] and "need the per-host network model" in capsys.readouterr().out
    args.convergence_from = "earlier/results.json"
    earlier = dict(command="python -m benchmarks all", commit="abc1234", hsdp_convergence=[{"method": "x"}])
    assert bench._hsdp_convergence(args, report, earlier) == (
        [{"method": "x"}],
        "`python -m benchmarks all` on abc1234",
    )
    none = bench._parser().parse_args(["all", "--hsdp-layouts", "--hsdp-convergence-methods"])
    assert (none.hsdp_layouts, none.hsdp_conv_methods) == ([], [])
    assert bench._hsdp(none) == [] and bench._hsdp_convergence(none, report) == ([], None) and len(ran) == 2


def test_the_mean_of_the_first_steps_is_kept_for_each_count_they_reach():
    from benchmarks import first_steps

    times = [float(t) for t in range(1, 121)]  # 1 ms, 2 ms, ...
    assert first_steps.means(times) == {"30": 15.5, "100": 50.5}
    assert first_steps.means(times[:30]) == {"30": 15.5}  # N = 30: no mean of 100
    assert first_steps.means(times[:29]) == {} and first_steps.means([]) == {}
    assert first_steps.first_mean({"first_steps_mean_ms": {"30": 15.5}}) == 15.5
    assert first_steps.first_mean({"first_steps_mean_ms": {"30": 15.5}}, 100) is None
    assert first_steps.first_mean({"step_ms": 3.0}) is None  # a row that kept none


def _first(method, first_30, first_100=None, step_ms=90.0, ranks=2, per_host=1):
    """A `bench trial` record of the comm model at 1 Gbit/s."""
    mean = {"30": first_30} if first_30 is not None else {}
    if first_100 is not None:
        mean["100"] = first_100
    return dict(
        model="comm",
        ranks=ranks,
        ranks_per_host=per_host,
        network="1gbit",
        network_model="per-host" if per_host == 1 else f"per-host, hosts of {per_host}",
        method=method,
        step_ms=step_ms,
        first_steps_mean_ms=mean,
    )


def test_auto_s_first_steps_are_set_against_the_fastest_fixed_exchange_of_its_cell():
    from benchmarks import first_steps

    cell = first_steps.against_fastest(
        [
            _first("DGC 0.1% auto", 115.0),  # faster than every fixed row: not their yardstick
            _first("DGC 0.1% allgather", 120.0),
            _first("DGC 0.1% spardl", 100.0),
            _first("DGC 0.1% hierarchical", None),  # kept fewer than 30 steps
        ]
    )
    assert [r[first_steps.RATIO] for r in cell] == [1.15, 1.2, 1.0, None]
    assert first_steps.RATIO == "first_30_vs_fastest_fixed"
    alone = first_steps.against_fastest([_first("DGC 0.1% auto", 115.0)])  # no fixed row: no ratio
    assert alone[0][first_steps.RATIO] is None
    assert first_steps.rows(1) == ("DGC 0.1% auto", "DGC 0.1% allgather", "DGC 0.1% spardl")
    assert first_steps.rows(2) == first_steps.rows(1) + ("DGC 0.1% hierarchical",)


def test_first_steps_tables_print_a_cell_each_and_the_page_a_short_section():
    from benchmarks import first_steps, report

    flat = first_steps.against_fastest([_first("DGC 0.1% auto", 230.0, 120.5), _first("DGC 0.1% spardl", 100.0)])
    hosts = first_steps.against_fastest(
        [_first("DGC 0.1% auto", 99.0, ranks=4, per_host=2), _first("DGC 0.1% hierarchical", 90.0, ranks=4, per_host=2)]
    )
    text = first_steps.table(flat + hosts)
    blocks = text.split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == [
        "comm model, 2 ranks, 1gbit (per-host)",
        "comm model, 2x2 ranks, 1gbit (per-host)",
    ]
    header = blocks[0].splitlines()[1]
    assert header.split() == "row first 30 ms first 100 ms steady ms first 30 vs fastest fixed".split()
    assert blocks[0].splitlines()[3].split() == ["DGC", "0.1%", "auto", "230.0", "120.5", "90.0", "2.30x"]
    assert blocks[1].splitlines()[4].split() == ["DGC", "0.1%", "hierarchical", "90.0", "-", "90.0", "1.00x"]
    section = report._first_steps_block(flat + hosts)
    assert section.startswith("## First steps of exchange=auto\n") and report._first_steps_block([]) == ""
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert len(report.FIRST_STEPS_HEADER) <= 8 and len(table) == 2 + 4
    assert table[2] == "| 2 | 1gbit | DGC 0.1% auto | 230.0 | 120.5 | 90.0 | 2.30x |"
    assert table[5] == "| 2x2 | 1gbit | DGC 0.1% hierarchical | 90.0 | - | 90.0 | 1.00x |"


@pytest.mark.parametrize(
    "text, layout",
    [("2", (2, 1)), ("4", (4, 1)), ("2x2", (4, 2)), ("3x2", (6, 2)), ("1", None), ("2x1", None), ("x", None)],
)
def test_a_trial_layout_is_ranks_or_hosts_of_several_ranks(text, layout):
    import argparse

    from benchmarks import first_steps

    if layout is None:
        with pytest.raises(argparse.ArgumentTypeError, match="a layout should be N"):
            first_steps.layout(text)
    else:
        assert first_steps.layout(text) == layout


def test_bench_trial_and_all_take_the_first_steps_options():
    from benchmarks.__main__ import _parser

    args = _parser().parse_args(["trial"])
    assert (args.layouts, args.first_steps, args.out, args.steps) == ([(2, 1), (4, 2)], 100, "results", None)
    args = _parser().parse_args(["trial", "--layouts", "2x2", "--first-steps", "30", "--out", "/tmp/t"])
    assert (args.layouts, args.first_steps, args.out) == ([(4, 2)], 30, "/tmp/t")
    args = _parser().parse_args(["all", "--trial-layouts"])  # none: `bench all` runs no trial cell
    assert args.layouts == [] and args.first_steps == 100
    assert _parser().parse_args(["all"]).layouts == [(2, 1), (4, 2)]


def test_a_row_with_an_exchange_warms_up_its_first_steps_and_auto_its_trial():
    from types import SimpleNamespace

    from benchmarks.e2e_worker import SETTLING_STEPS, warmups

    auto, fixed = SimpleNamespace(exchange="auto"), SimpleNamespace(exchange="spardl")
    assert warmups(fixed, 3, 0) == (3, 0) and warmups(fixed, 3, 100) == (100, 100)
    assert warmups(auto, 3, 0) == (max(3, SETTLING_STEPS), 0)
    assert warmups(auto, 3, 100) == (max(100, SETTLING_STEPS), 100)
    assert warmups(SimpleNamespace(exchange=None), 3, 100) == (3, 0)  # RandomBlock's shared allreduce
    assert warmups(object(), 3, 100) == (3, 0)  # Horovod's compression: no exchange


def test_first_steps_of_several_launches_are_averaged_step_by_step_in_rotated_order():
    from benchmarks import first_steps

    assert first_steps.rotated(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert first_steps.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]  # every row leads a launch in turn
    launches = [
        [dict(_first("DGC 0.1% auto", 0.0), first_steps_ms=[300.0] + [100.0] * 29, step_ms=90.0)],
        [dict(_first("DGC 0.1% auto", 0.0), first_steps_ms=[100.0] * 30, step_ms=110.0)],
        [dict(_first("DGC 0.1% auto", 0.0), first_steps_ms=[200.0] * 30, step_ms=100.0)],
    ]
    (row,) = first_steps.merged(launches)
    assert row["first_steps_ms"][:2] == [200.0, 400.0 / 3] and row["launches"] == 3
    assert row["first_steps_mean_ms"] == {"30": pytest.approx((200 + 29 * 400 / 3) / 30)}
    assert row["step_ms"] == 100.0  # the median launch's steady step
