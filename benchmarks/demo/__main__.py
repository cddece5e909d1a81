"""`python -m benchmarks.demo` (what `make demo` runs): the short version of `make bench`, in
a few minutes. Two ranks, dense allreduce vs DGC at 0.1%:

  1. speed: the communication-heavy model (MLP, 25.2M parameters; --model comm-small, 6.3M) on
     an emulated 1 Gbit/s network (a network namespace with a shaped loopback; plain loopback
     where that is not allowed, and it says so);
  2. accuracy: a small CNN on scikit-learn's digits, same seeds and epochs.

With --ddp, the speed run compares PyTorch DDP's own allreduce with DGC at 0.1% as DDP's
communication hook (sparsecomm.torch.ddp_hook) instead; the accuracy run is the same (the hook
computes what the Horovod path does, bit for bit in tests/multirank/test_ddp.py).

Prints a table and writes a figure (--out)."""

import argparse
import json
import os

from benchmarks import convergence, e2e, report

SPEED = ("dense", "DGC 0.1% auto")
DDP_SPEED = ("DDP dense", "DDP + DGC 0.1%")
# the same DGC settings in the digits run
ACCURACY = {"dense": "dense", "DGC 0.1% auto": "DGC 0.1%", "DDP dense": "dense", "DDP + DGC 0.1%": "DGC 0.1%"}


def figure(speed, accuracy, path, model):
    plt = report._plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar([r["method"] for r in speed], [r["step_ms"] for r in speed], color=["grey", "tab:blue"])
    left.set_ylabel("ms per step")
    left.set_title(f"{e2e.mlp_name(model)}, 2 ranks, {speed[0]['network']}")
    for r in accuracy:
        right.plot(range(1, len(r["curve"]) + 1), r["curve"], label=r["method"])
    right.set_xlabel("epoch")
    right.set_ylabel("test accuracy")
    right.set_ylim(0.8, 1.0)
    right.set_title("CNN on digits, 2 ranks")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--network", default="1gbit", choices=["1gbit", "10gbit", "unshaped"])
    parser.add_argument("--epochs", type=int, default=30, help="digits epochs (default 30)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps of the speed run (default 5)")
    parser.add_argument("--out", default="demo-results", help="directory for demo.png and demo.json")
    parser.add_argument("--ddp", action="store_true", help="time PyTorch DDP, dense and with the DGC hook")
    parser.add_argument(
        "--model", default="comm", choices=list(e2e.MLP_WIDTHS), help="the speed run's MLP (default comm, 25.2M)"
    )
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    net = None if args.network == "unshaped" else args.network
    print(f"== speed: 2 ranks, {e2e.mlp_name(args.model)}, {args.network}", flush=True)
    speed = e2e.run_one(2, net, args.model, list(DDP_SPEED if args.ddp else SPEED), warmup=2, steps=args.steps)
    print(f"== accuracy: 2 ranks, CNN on digits, {args.epochs} epochs", flush=True)
    accuracy = convergence.run("digits", 2, list(dict.fromkeys(ACCURACY.values())), args.epochs, seeds=(0,))
    by_method = {r["method"]: r for r in accuracy}
    rows = []
    for r in speed:
        acc = by_method[ACCURACY[r["method"]]]
        rows.append(
            {
                "method": r["method"],
                "network": r["network"],
                "step_ms": r["step_ms"],
                "speedup": r["speedup_vs_dense"] or speed[0]["step_ms"] / r["step_ms"],  # --ddp: vs DDP dense
                "received_mb": r["received_bytes"] / 1e6,
                "exchange": ",".join(r["exchanges"]) or "allreduce",
                "accuracy": acc["final"],
                "bytes_vs_dense": acc["dense_bytes_per_step"] / max(acc["sent_bytes_per_step"], 1),
            }
        )
    header = (
        f"{'method':<16}{'ms/step':>10}{'speedup':>9}{'recv MB/step':>14}  {'exchange':<10}"
        f"{'digits accuracy':>16}{'bytes vs dense':>16}"
    )
    print(f"\nsparsecomm demo: 2 ranks on {speed[0]['network']} loopback\n{header}\n{'-' * len(header)}")
    for r in rows:
        print(
            f"{r['method']:<16}{r['step_ms']:>10.1f}{r['speedup']:>8.1f}x{r['received_mb']:>14.3f}  "
            f"{r['exchange']:<10}{100 * r['accuracy']:>15.1f}%{r['bytes_vs_dense']:>15.0f}x"
        )
    print(
        "speedup: the first row's step time / this one, measured in the same run. recv: bytes each rank receives per "
        "step (the speed model).\nbytes vs dense: payload per step in the digits run (DGC's warm-up included). "
        "The full matrix is `make bench` (docs/results.md)."
    )
    figure(speed, accuracy, os.path.join(args.out, "demo.png"), args.model)
    with open(os.path.join(args.out, "demo.json"), "w") as f:
        json.dump({"rows": rows, "speed": speed, "accuracy": accuracy}, f, indent=1)
    print(f"wrote {args.out}/demo.png and {args.out}/demo.json")


if __name__ == "__main__":
    main()
