"""The TensorFlow compressors' whole path on one rank, for the kernel benchmark (kernels.py): in
a process of its own, where only horovod.tensorflow is initialised. Each path, as
horovod.tensorflow runs it in a tf.function (compress -> Horovod allreduce -> decompress), is
timed in turn with the memcpy of the kernel benchmark, on the same gradient. TF's ops are
functional: the gradient is not consumed, so nothing is refilled between calls; the state
(residual, momentum) evolves from call to call, as torch's does.

    python -m sparsecomm.check.tf_paths --numel N --density D [--dtype float32] [--repeats 7]

prints [[name, median ms, its memcpy's median ms], ...] as JSON on its last line."""

import argparse
import json

import torch


def path_cases(x, density):
    """(name, fn) of each TF compressor's whole path on the gradient x (a torch tensor)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from .. import tensorflow as sctf
    from .kernels import path_methods

    hvd.init()
    grad = tf.cast(tf.constant(x.float().numpy()), str(x.dtype).replace("torch.", ""))
    cases = []
    for name in path_methods(density):
        variable = tf.Variable(tf.zeros_like(grad))
        compressor = getattr(sctf, name)(
            ratio=density, exchange="allgather", variables=[variable], min_numel=0, dense_1d=False
        )

        @tf.function
        def path(compressor=compressor):  # one element of the result: enough to wait for all of it
            return hvd.allreduce(grad, compression=compressor, name="bench.tf.path")[:1]

        cases.append((f"TF {name} whole path (1 rank)", lambda path=path: path().numpy()))
    return cases


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--numel", type=int, required=True)
    parser.add_argument("--density", type=float, required=True)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    from .kernels import gradient, memcpy_of, paired_median_ms

    device = torch.device("cpu")
    memcpy = memcpy_of(args.numel, device)
    x = gradient(args.numel, getattr(torch, args.dtype), device)
    timings = [(name, *paired_median_ms(fn, memcpy, device, args.repeats)) for name, fn in path_cases(x, args.density)]
    print(json.dumps(timings))


if __name__ == "__main__":
    main()
