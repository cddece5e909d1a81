"""python -m sparsecomm.bench kernels [--json PATH] [--device cpu|cuda] [--dtype float32|float16|bfloat16]"""
import argparse
import json
import platform

import torch

from . import kernels


def main():
    parser = argparse.ArgumentParser(prog="python -m sparsecomm.bench")
    sub = parser.add_subparsers(dest="command", required=True)
    k = sub.add_parser("kernels", help="time every kernel against memcpy and torch.topk in the same run")
    k.add_argument("--json", help="write one record per measurement here")
    k.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    k.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    k.add_argument("--sizes", type=int, nargs="+", default=list(kernels.SIZES))
    k.add_argument("--densities", type=float, nargs="+", default=list(kernels.DENSITIES))
    k.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    total = len(args.sizes) * len(args.densities) * 8
    done = [0]

    def progress(record):
        done[0] += 1
        print(f"\r[{done[0]:>3}/{total}] {record['op']:<40} numel {record['numel']:>12,} "
              f"density {record['density']:<6} {record['median_ms']:9.3f} ms", end="", flush=True)

    records = kernels.run(args.device, getattr(torch, args.dtype), args.sizes, args.densities, args.repeats, progress)
    print("\n\n" + kernels.table(records))
    if args.json:
        machine = {"python": platform.python_version(), "torch": torch.__version__, "cpu": platform.processor(),
                   "threads": torch.get_num_threads()}
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "records": records}, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
