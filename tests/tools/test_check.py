"""`python -m sparsecomm.check` (what `make check` runs): the verdict and exit code on fabricated
results; the op test step's two routes (a checkout's pytest, an install's self-test) run for
real; and the decisions of the GPU paths (which backend, or why a step cannot run) on fabricated
environments, since this machine and CI have no GPU to take them. A whole --quick run, from an
installed package as a user runs it: test_install.py."""

import dataclasses
import json
import re

from sparsecomm.check import cli, environment, report, steps
from sparsecomm.check.report import FAIL, PASS, SKIP, Result


def _row(table, step):
    """(status, detail) of a step's row in the printed table."""
    line = next(line for line in table.splitlines() if line.startswith(step + "  "))
    status, _seconds, detail = line[len(step) :].split(maxsplit=2)
    return status, detail


def test_a_failed_step_makes_the_exit_code_1_and_a_skip_does_not(tmp_path, capsys):
    skipped = [Result("environment", PASS, "fine", 0.1), Result("op tests (cuda)", SKIP, "no CUDA device", 0.0)]
    failed = skipped + [Result("2-rank training (cpu)", FAIL, "Gloo: TopK spardl: ranks differ", 3.0)]
    assert report.exit_code(skipped) == 0 and report.exit_code(failed) == 1
    assert report.exit_code([]) == 0
    assert cli.finish(failed, str(tmp_path / "r.json")) == 1
    table = capsys.readouterr().out
    assert _row(table, "2-rank training (cpu)") == (FAIL, "Gloo: TopK spardl: ranks differ")
    assert "verdict: FAIL (1 passed, 1 failed, 1 skipped): 2-rank training (cpu)" in table
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["exit_code"] == 1 and written["steps"][2]["status"] == FAIL
    assert cli.finish(skipped) == 0
    assert (
        "verdict: OK (1 passed, 0 failed, 1 skipped): nothing failed, but these did NOT run here: op tests (cuda)"
        in capsys.readouterr().out
    )


def test_an_exception_in_a_step_is_that_steps_fail():
    def broken():
        raise KeyError("records")

    result = cli.run_step("kernel benchmark (cuda)", broken)
    assert (result.status, result.detail) == (FAIL, "the check itself raised KeyError: 'records'")


def test_the_smoke_test_flags_each_kind_of_bad_record():
    good = {
        "config": "TopK spardl",
        "exchange": "spardl",
        "loss_before": 2.3,
        "loss_after": 2.1,
        "ranks_equal": True,
        "max_rank_difference": 0.0,
        "exchanges": ["spardl"],
        "sent_bytes": 20,
        "dense_bytes": 100,
    }
    assert steps.smoke_problems(good) == []
    for bad in (
        {"loss_after": 2.4},
        {"loss_after": float("nan")},
        {"ranks_equal": False, "max_rank_difference": 1e-7},
        {"exchanges": ["allgather"]},
        {"exchanges": ["allgather", "spardl"]},
        {"sent_bytes": 100},
    ):
        problems = steps.smoke_problems(dict(good, **bad))
        assert len(problems) == 1 and problems[0].startswith("TopK spardl: "), (bad, problems)


def test_auto_may_take_any_of_its_routes_and_one_rank_routes_nothing():
    auto = {
        "config": "DGC auto",
        "exchange": "auto",
        "ranks": 2,
        "loss_before": 2.3,
        "loss_after": 2.1,
        "ranks_equal": True,
        "exchanges": ["allgather", "dense"],
        "sent_bytes": 100,  # dense where that is faster: as many bytes as dense is no fault
        "dense_bytes": 100,
    }
    assert steps.smoke_problems(auto) == []
    assert steps.smoke_problems(dict(auto, exchanges=[], ranks=1)) == []
    for bad in ({"exchanges": []}, {"exchanges": ["allgather", "shared"]}):
        problems = steps.smoke_problems(dict(auto, **bad))
        assert len(problems) == 1 and problems[0].startswith("DGC auto: exchanges used"), (bad, problems)


def test_a_failed_launch_names_the_first_error_of_a_rank():
    output = (
        "[rank1]: Traceback (most recent call last):\n"
        "[rank1]: RuntimeError: Expected all tensors to be on the same device\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    )
    status, detail = steps.judged(1, output, "/nonexistent", "NCCL, 2 ranks", 30)
    assert status == FAIL and detail == (
        "NCCL, 2 ranks: the launch exited 1; first error: [rank1]: RuntimeError: Expected all tensors to be on "
        "the same device"
    ), detail
    assert steps.first_rank_error("x\nterminate called after throwing an instance of 'gloo::IoException'\n") == (
        "terminate called after throwing an instance of 'gloo::IoException'"
    )
    assert steps.first_rank_error("ChildFailedError: \nrank 0 exit code -6\n") is None


def _env(**changes):
    """A machine with 2 GPUs, sparsecomm's CUDA kernels and Horovod with NCCL 2.18.5 and Gloo."""
    base = environment.Environment(
        python="3.11",
        torch="2.5.0+cu124",
        torch_cuda="12.4",
        cuda_warning="",
        gpus=["H100", "H100"],
        driver_gpus=2,
        extension_error=None,
        extension_cuda=True,
        horovod="0.28.1",
        horovod_error="",
        nccl=21805,
        gloo=True,
        mpi=True,
        horovod_cuda=True,
        tensorflow=None,
        tf_ops=False,
        tests="/src/tests",
    )
    return dataclasses.replace(base, **changes)


def test_which_backend_the_2_rank_runs_use_or_why_they_cannot_run():
    assert steps.launch_plan(_env(), "cuda") == ("--gloo", "NCCL 2.18.5, one GPU per rank")
    assert steps.launch_plan(_env(), "cpu") == ("--gloo", "Gloo")
    assert steps.launch_plan(_env(gloo=False), "cpu") == ("--mpi", "MPI")
    flag, reason = steps.launch_plan(_env(gpus=["H100"]), "cuda")  # NCCL refuses two ranks on one GPU
    assert flag is None and "one GPU per rank" in reason and "only 1 GPU" in reason
    flag, backend = steps.launch_plan(_env(gpus=["H100"], nccl=0), "cuda")
    assert flag == "--gloo" and "both ranks on GPU 0" in backend
    flag, reason = steps.launch_plan(_env(nccl=0, horovod_cuda=False), "cuda")
    assert flag is None and "horovod.torch.cuda_built() is False" in reason
    flag, reason = steps.launch_plan(_env(horovod=None, horovod_error="ImportError: no horovod"), "cpu")
    assert flag is None and reason == "horovod does not import: ImportError: no horovod"


def test_why_a_step_cannot_run_on_a_device():
    assert environment.blocker(_env(), "cuda") is None and environment.blocker(_env(), "cpu") is None
    status, reason = environment.blocker(_env(gpus=[], torch_cuda=None, driver_gpus=0), "cuda")
    assert status == SKIP and reason == environment.NO_CUDA + "; torch is a CPU-only build"
    status, reason = environment.blocker(_env(gpus=[], torch="2.13.0+cpu", torch_cuda=None), "cuda")
    assert status == SKIP and reason == (
        environment.NO_CUDA + ": torch 2.13.0+cpu is a CPU-only build, yet the "
        "NVIDIA driver lists 2 GPU(s): install a CUDA build of torch"
    )
    status, reason = environment.blocker(_env(extension_cuda=False), "cuda")  # a GPU sparsecomm cannot use
    assert status == FAIL and "no CUDA kernels" in reason and "SPARSECOMM_WITH_CUDA=1" in reason
    assert environment.blocker(_env(extension_cuda=False), "cpu") is None
    status, reason = environment.blocker(_env(extension_error="ImportError: _C"), "cpu")
    assert status == FAIL and reason.endswith("ImportError: _C")
    status, detail = steps.op_tests(_env(gpus=[], tests=None), "cpu", quick=True)  # an installed package
    assert status == PASS and re.fullmatch(r"\d+ passed, 0 failed \(python -m sparsecomm.selftest: .*\)", detail)
    status, reason = steps.kernel_bench(_env(), "cpu", quick=True)  # a usable GPU: the benchmark runs there
    assert status == SKIP and reason.startswith("benchmarked on cuda instead")


def test_the_kernel_summary_reads_the_largest_size_at_the_smallest_density():
    records = [
        {"op": op, "numel": n, "density": d, "median_ms": ms, "memcpy_ms": 0.5, "topk_ms": 2.0}
        for n in (1000, 4000)
        for d in (0.01, 0.001)
        for op, ms in (("pack_sampled (estimate + pack + band)", 1.0), ("pack_topk (exact top-k, EF)", 4.0))
    ]
    assert steps.bench_summary(records) == (
        "4,000 floats at density 0.001: DGC/Threshold pack 2.0x a memcpy, 2.0x faster than torch.topk; "
        "exact top-k pack 8.0x a memcpy, 2.0x slower than torch.topk; copy 0.1 GB/s"
    )


def test_the_op_test_step_of_a_checkout_runs_its_op_tests_and_counts_them(monkeypatch):
    """The checkout's own route (the installed one is test_install.py's), on one of its op test
    files: the suite runs every one of them already."""
    env = environment.probe()
    assert env.tests is not None  # a checkout: its tests/ beside the package
    monkeypatch.setattr(steps, "OP_TEST_FILES", ("ops/test_torch_block_ops.py",))
    status, detail = steps.op_tests(env, "cpu", quick=True)
    assert status == PASS, detail
    assert re.fullmatch(r"\d+ passed \(pytest -k 'not cuda' tests/\{ops/test_torch_block_ops.py\}\)", detail), detail


def test_a_failing_op_test_fails_its_step_and_names_the_test(tmp_path, capsys):
    """A real pytest run over a stand-in tests/ directory with one failing test."""
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "conftest.py").write_text(  # beside the tests: tmp_path is outside the rootdir
        "import pytest\n\n@pytest.fixture(params=['cpu'])\ndef device(request):\n    return request.param\n"
    )
    (tmp_path / "ops" / "test_torch_select_ops.py").write_text(
        "def test_good(device):\n    pass\n\ndef test_bad(device):\n    assert device == 'elsewhere'\n"
    )
    others = [name for name in environment.OP_TEST_FILES if not name.endswith("test_torch_select_ops.py")]
    for name in others:
        (tmp_path / name).write_text("def test_fine(device):\n    pass\n")
    status, detail = steps.op_tests(_env(tests=str(tmp_path)), "cpu", quick=True)
    assert status == FAIL and detail.startswith(f"1 failed, {1 + len(others)} passed (pytest -k 'not cuda' "), detail
    assert detail.endswith("test_torch_select_ops.py::test_bad[cpu]"), detail
    assert "assert 'cpu' == 'elsewhere'" in capsys.readouterr().out  # pytest's own report, shown above the table
