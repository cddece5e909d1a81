"""Worker: SGD steps of the digits MLP under hvd.DistributedOptimizer with exchange="spardl"
(and "allgather", and "auto" on a given network and on the measured one) for each per-rank-coordinate method, and
SparDL with values in 16 bits (models in bfloat16 and float16, Threshold(quantize="fp16")).
Saves every rank's local gradients (recorded after backward, before the exchange), the
exchanged gradients and the parameters after every step, final residuals and stats, for a
replay of the N ranks."""

import os

import common
import horovod.torch as hvd
import torch
from common import EVERY

from sparsecomm import Network
from sparsecomm.core import plan
from sparsecomm.torch import DGC, RTopK, Threshold, TopK

args = common.worker_parser(steps=4, lr=0.5).parse_args()
common.start_torch()
SLOW = Network(bandwidth=1e7, latency=1e-6)  # bytes dominate: a sparse exchange wins
FAST = Network(bandwidth=1e12, latency=0.0, copy_bandwidth=1e8)  # packing costs more than sending: dense wins
CONFIGS = {
    "dense": lambda m: hvd.Compression.none,
    "topk_0.1_spardl": lambda m: TopK(ratio=0.1, exchange="spardl", named_parameters=m.named_parameters(), **EVERY),
    "topk_0.1_allgather": lambda m: TopK(
        ratio=0.1, exchange="allgather", named_parameters=m.named_parameters(), **EVERY
    ),
    "topk_1.0_spardl": lambda m: TopK(
        ratio=1.0, exchange="spardl", dense_fallback=False, named_parameters=m.named_parameters(), **EVERY
    ),
    "threshold_0.1_spardl": lambda m: Threshold(
        ratio=0.1, exchange="spardl", named_parameters=m.named_parameters(), **EVERY
    ),
    "rtopk_0.1_spardl": lambda m: RTopK(
        ratio=0.1, r=0.3, seed=7, exchange="spardl", named_parameters=m.named_parameters(), **EVERY
    ),
    "dgc_0.1_spardl": lambda m: DGC(
        ratio=0.1, momentum=0.9, exchange="spardl", named_parameters=m.named_parameters(), **EVERY
    ),
    "topk_0.1_no_feedback_spardl": lambda m: TopK(
        ratio=0.1, exchange="spardl", error_feedback=False, named_parameters=m.named_parameters(), **EVERY
    ),
    "topk_0.1_auto_slow": lambda m: TopK(ratio=0.1, network=SLOW, named_parameters=m.named_parameters(), **EVERY),
    "topk_0.1_auto_fast": lambda m: TopK(ratio=0.1, network=FAST, named_parameters=m.named_parameters(), **EVERY),
    # values on the wire in 16 bits: a model in that dtype, and float32 gradients sent as float16
    "topk_0.1_spardl_bfloat16": lambda m: TopK(
        ratio=0.1, exchange="spardl", named_parameters=m.named_parameters(), **EVERY
    ),
    "topk_0.1_spardl_float16": lambda m: TopK(
        ratio=0.1, exchange="spardl", named_parameters=m.named_parameters(), **EVERY
    ),
    "threshold_fp16_0.1_spardl": lambda m: Threshold(
        ratio=0.1, quantize="fp16", exchange="spardl", named_parameters=m.named_parameters(), **EVERY
    ),
}
DTYPES = {"topk_0.1_spardl_bfloat16": torch.bfloat16, "topk_0.1_spardl_float16": torch.float16}
# exchange="auto" measuring the cluster: it watches, measures, routes every tensor by each flat sparse
# exchange once (the trial's uncounted steps), then by the model's routes, its last step here
MEASURED = {"topk_0.1_auto_measured": lambda m: TopK(ratio=0.1, named_parameters=m.named_parameters(), **EVERY)}
MEASURED_STEPS = plan.first_counted_step() + 1
results = common.train_recorded(CONFIGS, DTYPES, args.steps, args.lr)
results.update(common.train_recorded(MEASURED, {}, max(args.steps, MEASURED_STEPS), args.lr))
torch.save(results, os.path.join(args.out, f"rank{hvd.rank()}.pt"))
print(f"rank {hvd.rank()}/{hvd.size()}: {len(results)} configs done")
