"""The DDP hook's own cost (`python -m benchmarks hook-step`, and a part of `bench all`):
`python -m sparsecomm.check.hook_step` on one rank, no network, for each of --hook-step-layouts:

  resnet50   ResNet-50's 161 parameter shapes against the same 25.6M elements as 16 tensors
  small      161 matrices of 64x64 against 16 tensors of the same elements: what a tensor costs
             the hook itself, not its kernels' passes over memory

Each hook's step is set against DDP's own allreduce step on the same tensors, in the same run;
its cost per tensor is its extra time over DDP's at 161 tensors less that at 16, over the 145
more tensors."""

import json
import os
import subprocess
import sys
import tempfile

from . import scaling

LAYOUTS = ("resnet50", "small")
LAYOUT_NAMES = {"resnet50": "ResNet-50's 161 shapes", "small": "161 matrices of 64x64"}
BASE = "DDP allreduce"  # the row every other is set against (sparsecomm.check.hook_step.METHODS)
CSV_HEADER = ["shapes", "method", "tensors", "step ms", "x DDP allreduce", "extra ms", "us per tensor"]


def add_options(parser):
    parser.add_argument(
        "--hook-step-layouts",
        nargs="*",
        choices=LAYOUTS,
        default=list(LAYOUTS),
        help="the tensors the DDP hook's step is timed on (none: skip it; default: both)",
    )
    parser.add_argument("--hook-step-steps", type=int, default=10, help="timed steps per row (default: 10)")


def run(args):
    """The records of `sparsecomm.check.hook_step` for each layout, each with its `shapes`."""
    records = []
    for layout in args.hook_step_layouts:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "hook_step.json")
            command = [sys.executable, "-m", "sparsecomm.check.hook_step", "--layout", layout, "--json", path]
            subprocess.run([*command, "--steps", str(args.hook_step_steps)], check=True)
            with open(path) as f:
                records += [dict(r, shapes=layout) for r in json.load(f)["records"]]
    return records


def csv_rows(records):
    """(header, rows): every record, for hook_step.csv."""
    rows = [
        [
            r["shapes"],
            r["method"],
            r["tensors"],
            f"{r['step_ms']:.2f}",
            f"{r['vs_allreduce']:.2f}",
            f"{r['extra_ms']:.2f}",
            f"{r['us_per_tensor']:.1f}",
        ]
        for r in records
    ]
    return CSV_HEADER, rows


def own_us_per_tensor(records, shapes):
    """DDP's allreduce step's own cost per tensor on `shapes`: its step at 161 tensors less that at
    16, over the 145 more."""
    by = {r["tensors"]: r for r in records if r["shapes"] == shapes and r["method"] == BASE}
    return (by[161]["step_ms"] - by[16]["step_ms"]) / 145 * 1e3


def text(records, rel, source=None):
    """A paragraph: on one layout (ResNet-50's where timed), DDP's allreduce step at 161 tensors and
    its cost a tensor, then each hook's step over it and its cost a tensor over DDP's; every layout
    is in hook_step.csv. "" without records."""
    if not records:
        return ""
    shapes = next(s for s in LAYOUTS if any(r["shapes"] == s for r in records))
    many = [r for r in records if r["shapes"] == shapes and r["tensors"] == 161]
    base = next(r for r in many if r["method"] == BASE)
    hooks = ", ".join(
        f"{r['method']} {r['vs_allreduce']:.2f}x ({r['us_per_tensor']:+.0f} us)" for r in many if r is not base
    )
    by = f" Timed by {source}." if source else ""
    return scaling._para(
        "**The DDP hook's own cost** (one rank, no network, `python -m sparsecomm.check.hook_step`): each hook's "
        "step over DDP's allreduce step at 161 tensors, and what a tensor costs it over DDP's (its extra time at "
        f"161 tensors less that at 16, over the 145 more). {LAYOUT_NAMES[shapes]}: DDP's allreduce step "
        f"{base['step_ms']:.1f} ms ({own_us_per_tensor(records, shapes):.0f} us a tensor); {hooks}.{by} "
        f"Every layout: [hook_step.csv]({rel}/hook_step.csv)."
    )
