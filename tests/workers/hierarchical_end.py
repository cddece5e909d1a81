"""Worker: how a job that ran exchange="hierarchical" ends on 2 hosts, in PyTorch or TensorFlow.
After one exchange, host 1's ranks exit at once, while host 0's ranks gather inside their host
--late seconds later, as a host still in the exchange's last phase does. An exit shuts Horovod
down for every rank, so a rank waits at exit (sparsecomm.host_sets.end_together) until every
rank has reached its own, at most --wait seconds: past that, host 1 exits and host 0's gather
fails, as Horovod's would."""

import argparse
import time

import common
import numpy as np

from sparsecomm import host_sets

parser = argparse.ArgumentParser()
parser.add_argument("--framework", choices=["torch", "tf"], required=True)
parser.add_argument("--late", type=float, required=True)
parser.add_argument("--wait", type=float, required=True)
args = parser.parse_args()

gradient = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
if args.framework == "torch":
    import horovod.torch as hvd
    import torch

    from sparsecomm.torch import TopK, host_process_sets

    hvd.init(process_sets=host_process_sets())
    param = torch.nn.Parameter(torch.zeros(gradient.shape))
    param.grad = grad = torch.from_numpy(gradient)
    parameters = dict(named_parameters=[("w", param)])
    ones = torch.ones(1)
else:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from sparsecomm.tensorflow import TopK, host_process_sets

    hvd.init(process_sets=host_process_sets())
    grad = tf.constant(gradient)
    parameters = dict(variables=[("w", tf.Variable(tf.zeros_like(grad)))])
    ones = tf.ones([1])

host_sets.END_OF_JOB_SECONDS = args.wait
compression = TopK(ratio=0.1, exchange="hierarchical", **parameters, **common.EVERY)
hvd.allreduce(grad, op=hvd.Average, compression=compression, name="end.w")
assert compression.stats()["tensors"]["w"]["exchange"] == "hierarchical"
if hvd.cross_rank() == 0:
    time.sleep(args.late)
    host = host_sets.registered(hvd, hvd.size())[0]
    hvd.allgather(ones, name="late", process_set=host)
    print(f"rank {hvd.rank()}: gathered late")
print(f"rank {hvd.rank()}: exits")
