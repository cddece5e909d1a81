"""python -m sparsecomm.check [--quick] [--json PATH]: what `make check` runs.

Checks that sparsecomm works on this machine, on its GPUs when it has any:

  environment              torch and its CUDA, the GPUs, sparsecomm's extension (CUDA kernels?),
                           Horovod (NCCL, Gloo, MPI), TensorFlow
  op tests (cpu, cuda)     tests/ops/test_torch_*_ops.py against plain references (source checkout)
  kernel benchmark         every kernel against memcpy and torch.topk, on the GPU (on the CPU
                           when there is no usable GPU)
  DDP hook step            one rank's DDP step with each hook against DDP's own allreduce step,
                           on ResNet-50's 161 tensors and on 16: what one more tensor costs
                           (sparsecomm.check.hook_step; on the GPU, else on the CPU)
  2-rank training          horovodrun -np 2: a tiny model trained with DGC and TopK (allgather,
                           spardl); the loss must go down and the ranks end bitwise equal.
                           On cpu with Gloo; on cuda with NCCL (one GPU per rank) when Horovod
                           has it
  DDP training             torchrun: the same with the DDP hook (and Threshold 2-bit, DGC
                           with exchange="auto", RandomBlock), Gloo on cpu, NCCL on cuda (1 rank on 1 GPU)

Each step PASSes, FAILs, or is SKIPped with the reason. The exit code is 0 when nothing FAILed
(a SKIP is not a failure), 1 otherwise."""

import argparse
import json
import time
import traceback

from . import environment, report, steps
from .report import FAIL, PASS


def plan(env, quick):
    """(step name, function returning (status, detail)) in the order they run."""
    step = {"environment": lambda: (FAIL if env.extension_error else PASS, environment.summary(env))}
    for device in ("cpu", "cuda"):
        step[f"op tests ({device})"] = lambda device=device: steps.op_tests(env, device, quick)
    for device in ("cuda", "cpu"):
        step[f"kernel benchmark ({device})"] = lambda device=device: steps.kernel_bench(env, device, quick)
    for device in ("cuda", "cpu"):
        step[f"DDP hook step ({device})"] = lambda device=device: steps.hook_step(env, device, quick)
    for device in ("cpu", "cuda"):
        step[f"2-rank training ({device})"] = lambda device=device: steps.smoke(env, device, quick)
    for device in ("cpu", "cuda"):
        step[f"DDP training ({device})"] = lambda device=device: steps.ddp_smoke(env, device, quick)
    return list(step.items())


def run_step(name, function):
    """Runs one step and times it; an unexpected error in the step is that step's FAIL."""
    print(f"\n== {name}", flush=True)
    started = time.monotonic()
    try:
        status, detail = function()
    except Exception as error:
        traceback.print_exc()
        status, detail = FAIL, f"the check itself raised {type(error).__name__}: {error}"
    result = report.Result(name, status, detail, time.monotonic() - started)
    print(f"[check] {name}: {status}: {detail}", flush=True)
    return result


def finish(results, json_path=None, env=None):
    """Prints the verdict table, writes the JSON when asked, returns the exit code."""
    print("\nsparsecomm self-check\n" + report.table(results), flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(report.as_dict(results), environment=env and vars(env)), f, indent=1)
        print(f"wrote {json_path}")
    return report.exit_code(results)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m sparsecomm.check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="small benchmark sizes and few training steps (about a minute on a CPU)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the environment and the results here")
    args = parser.parse_args(argv)
    env = environment.probe()
    print(
        "sparsecomm self-check" + (" (--quick)" if args.quick else "") + "\n  " + "\n  ".join(environment.lines(env)),
        flush=True,
    )
    results = [run_step(name, function) for name, function in plan(env, args.quick)]
    return finish(results, args.json, env)
