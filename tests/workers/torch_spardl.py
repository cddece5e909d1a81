"""Worker: SGD steps of the digits MLP under hvd.DistributedOptimizer with exchange="spardl"
(and "allgather", and "auto" on a given network and on the measured one) for each per-rank-coordinate method, and
SparDL with values in 16 bits (models in bfloat16 and float16, Threshold(quantize="fp16")).
Saves every rank's local gradients (recorded after backward, before the exchange), the
exchanged gradients and the parameters after every step, final residuals and stats, for a
replay of the N ranks. --sizes: each size in turn on the first N ranks (common.sizes_of)."""

import os

import common
import horovod.torch as hvd
import torch
from common import EVERY

from sparsecomm import Network
from sparsecomm.core import plan
from sparsecomm.torch import DGC, RTopK, Threshold, TopK

args = common.add_sizes_argument(common.worker_parser(steps=4, lr=0.5)).parse_args()
SETS = common.start_torch(args.sizes)
SLOW = Network(bandwidth=1e7, latency=1e-6)  # bytes dominate: a sparse exchange wins
FAST = Network(bandwidth=1e12, latency=0.0, copy_bandwidth=1e8)  # packing costs more than sending: dense wins
CONFIGS = {
    "dense": lambda m, **on: hvd.Compression.none,
    "topk_0.1_spardl": lambda m, **on: TopK(
        ratio=0.1, exchange="spardl", named_parameters=m.named_parameters(), **EVERY, **on
    ),
    "topk_0.1_allgather": lambda m, **on: TopK(
        ratio=0.1, exchange="allgather", named_parameters=m.named_parameters(), **EVERY, **on
    ),
    "topk_1.0_spardl": lambda m, **on: TopK(
        ratio=1.0, exchange="spardl", dense_fallback=False, named_parameters=m.named_parameters(), **EVERY, **on
    ),
    "threshold_0.1_spardl": lambda m, **on: Threshold(
        ratio=0.1, exchange="spardl", named_parameters=m.named_parameters(), **EVERY, **on
    ),
    "rtopk_0.1_spardl": lambda m, **on: RTopK(
        ratio=0.1, r=0.3, seed=7, exchange="spardl", named_parameters=m.named_parameters(), **EVERY, **on
    ),
    "dgc_0.1_spardl": lambda m, **on: DGC(
        ratio=0.1, momentum=0.9, exchange="spardl", named_parameters=m.named_parameters(), **EVERY, **on
    ),
    "topk_0.1_no_feedback_spardl": lambda m, **on: TopK(
        ratio=0.1, exchange="spardl", error_feedback=False, named_parameters=m.named_parameters(), **EVERY, **on
    ),
    "topk_0.1_auto_slow": lambda m, **on: TopK(
        ratio=0.1, network=SLOW, named_parameters=m.named_parameters(), **EVERY, **on
    ),
    "topk_0.1_auto_fast": lambda m, **on: TopK(
        ratio=0.1, network=FAST, named_parameters=m.named_parameters(), **EVERY, **on
    ),
    # values on the wire in 16 bits: a model in that dtype, and float32 gradients sent as float16
    "topk_0.1_spardl_bfloat16": lambda m, **on: TopK(
        ratio=0.1, exchange="spardl", named_parameters=m.named_parameters(), **EVERY, **on
    ),
    "topk_0.1_spardl_float16": lambda m, **on: TopK(
        ratio=0.1, exchange="spardl", named_parameters=m.named_parameters(), **EVERY, **on
    ),
    "threshold_fp16_0.1_spardl": lambda m, **on: Threshold(
        ratio=0.1, quantize="fp16", exchange="spardl", named_parameters=m.named_parameters(), **EVERY, **on
    ),
}
DTYPES = {"topk_0.1_spardl_bfloat16": torch.bfloat16, "topk_0.1_spardl_float16": torch.float16}
# exchange="auto" measuring the cluster: it watches, measures, routes every tensor by each flat sparse
# exchange once (the trial's uncounted steps), then by the model's routes, its last step here
MEASURED = {
    "topk_0.1_auto_measured": lambda m, **on: TopK(ratio=0.1, named_parameters=m.named_parameters(), **EVERY, **on)
}
MEASURED_STEPS = plan.first_counted_step() + 1


def run(size, process_set):
    """Every config on the ranks of `process_set`, saved in the folder of `size`."""
    results = common.train_recorded(CONFIGS, DTYPES, args.steps, args.lr, process_set)
    results.update(common.train_recorded(MEASURED, {}, max(args.steps, MEASURED_STEPS), args.lr, process_set))
    torch.save(results, os.path.join(common.size_folder(args.out, size), f"rank{process_set.rank()}.pt"))
    print(f"rank {process_set.rank()}/{size}: {len(results)} configs done")


common.for_each_size(hvd, SETS, run, torch.zeros(1))
