"""python -m sparsecomm.info [--json PATH]: what this sparsecomm was built with, what this
environment has (torch, TensorFlow, Horovod), and a self-test of every compiled library
(sparsecomm.selftest, in a child process per framework and device). Needs no source
checkout. Exit 1 when a built part fails its test or does not fit the installed framework."""

import argparse
import glob
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

from . import build_info
from .check.report import FAIL, PASS, SKIP, Result, as_dict, table

FRAMEWORKS = {"torch": ("torch",), "tensorflow": ("tensorflow", "tensorflow-cpu")}


def installed_version(framework):
    for distribution in FRAMEWORKS[framework]:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


def same_release(built, installed):
    """The installed metadata's version may lack torch's local tag (2.14.1 for 2.14.1+cu130)."""
    return built == installed or ("+" not in installed and built.split("+")[0] == installed)


def horovod_line():
    """Horovod's version and the frameworks it has libraries for, without importing it."""
    spec = importlib.util.find_spec("horovod")
    if spec is None:
        return "not installed (python -m sparsecomm.install_horovod builds it; docs/install.md)"
    root = os.path.dirname(spec.origin)
    has = [
        label
        for sub, label in (("torch", "PyTorch"), ("tensorflow", "TensorFlow"))
        if glob.glob(os.path.join(root, sub, "mpi_lib*.so"))
    ]
    return f"{importlib.metadata.version('horovod')}, built with {', '.join(has) or 'no framework'}"


def selftest(framework, device, timeout=600):
    """One child's self-test, as a Result (the self-check's op tests in an installed package too)."""
    started = time.monotonic()
    name = f"{framework} kernels ({device})"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "sparsecomm.selftest", "--framework", framework, "--device", device],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        )
    except subprocess.TimeoutExpired:
        return Result(name, FAIL, f"timed out after {timeout}s", time.monotonic() - started)
    output = proc.stdout + proc.stderr
    counts = re.findall(r"^(\d+ passed, \d+ failed)$", proc.stdout, re.M)
    seconds = time.monotonic() - started
    if proc.returncode == 0 and counts:
        return Result(name, PASS, counts[-1], seconds)
    if "sees no" in output and not counts:
        return Result(name, SKIP, output.strip().splitlines()[-1], seconds)
    print(output.rstrip(), flush=True)
    last = counts[-1] if counts else (output.strip().splitlines() or ["no output"])[-1]
    return Result(name, FAIL, last, seconds)


def plan(info):
    """(framework, device) pairs to test: what was built and is installed."""
    runs = []
    for framework, gpu_key in (("torch", "cuda_kernels"), ("tensorflow", "gpu_kernels")):
        built = (info or {}).get(framework)
        if built and installed_version(framework):
            runs += [(framework, "cpu")] + ([(framework, "cuda")] if built[gpu_key] else [])
    return runs


def report_lines(info):
    lines = [f"location    {build_info.PACKAGE} ({'source checkout' if build_info.is_checkout() else 'installed'})"]
    lines += ["built       " + line for line in build_info.describe(info)]
    for framework in FRAMEWORKS:
        version, built = installed_version(framework), (info or {}).get(framework)
        fits = (
            ""
            if not (version and built)
            else (
                " (fits the build)"
                if same_release(built["version"], version)
                else f" (MISMATCH: built for {built['version']})"
            )
        )
        lines.append(f"installed   {framework} {version or 'absent'}{fits}")
    lines.append(f"horovod     {horovod_line()}")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m sparsecomm.info", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", metavar="PATH", help="also write the build record and the results here")
    args = parser.parse_args(argv)
    info = build_info.read()
    print("\n".join(report_lines(info)), flush=True)
    results = [selftest(framework, device) for framework, device in plan(info)]
    if not results:
        results = [Result("kernels", FAIL, "nothing built for an installed framework: " + build_info.rebuild_command())]
    print("\n" + table(results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(as_dict(results), build=info), f, indent=1)
    return 1 if any(r.status == FAIL for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
