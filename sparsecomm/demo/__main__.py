"""`python -m sparsecomm.demo` (what `make demo` runs): 2 ranks under horovodrun train a
small model on real data (scikit-learn's digits), dense vs sparsecomm, and print a table."""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-np", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    bin_dir = os.path.dirname(sys.executable)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.json")
        cmd = [os.path.join(bin_dir, "horovodrun"), "-np", str(args.np), "-H", f"localhost:{args.np}", "--gloo",
               sys.executable, "-m", "sparsecomm.demo.torch_digits", "--out", out, "--epochs", str(args.epochs)]
        env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3", PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
        print(f"$ {' '.join(cmd[:6])} ... sparsecomm.demo.torch_digits", flush=True)
        subprocess.run(cmd, env=env, check=True)
        with open(out) as f:
            report = json.load(f)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(f"\nsparsecomm demo: MLP 64-256-10 on scikit-learn digits (1,437 train / 360 test images), "
          f"{report['ranks']} ranks, {report['epochs']} epochs, SGD lr {report['lr']} momentum {report['momentum']}")
    header = f"{'method':<22}{'test accuracy':>14}{'bytes/rank/step':>17}{'vs dense':>10}{'step time':>12}"
    print(header + "\n" + "-" * len(header))
    dense_ms = report["results"][0]["step_ms"]
    for r in report["results"]:
        print(f"{r['method']:<22}{100 * r['accuracy']:>13.1f}%{r['bytes_per_step']:>17,.0f}"
              f"{r['dense_bytes_per_step'] / r['bytes_per_step']:>9.0f}x{r['step_ms']:>9.2f} ms")
    print("bytes/rank/step: payload each rank hands to Horovod per step. RandomBlock rides the allreduce (a ring "
          "puts 2(N-1)/N times that on the wire);\nTopK sends values + int32 indices by allgather (every rank "
          f"receives all N payloads).\nStep time on unshaped loopback (dense {dense_ms:.2f} ms): "
          "this network is fast, so compression is not expected to speed it up here.")


if __name__ == "__main__":
    main()
