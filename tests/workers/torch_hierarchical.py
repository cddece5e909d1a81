"""Worker: SGD steps of the digits MLP under hvd.DistributedOptimizer with exchange="hierarchical"
for each per-rank-coordinate method, on the hosts horovodrun's -H gives (their process sets
registered at hvd.init), beside dense and the flat allgather. Saves what torch_spardl.py saves
(common.train_recorded) and each rank's place, for a replay of the hosts."""

import argparse
import os

import common
import horovod.torch as hvd
import torch
from common import EVERY

from sparsecomm.torch import DGC, RTopK, Threshold, TopK, host_process_sets

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--lr", type=float, default=0.5)
args = parser.parse_args()
hvd.init(process_sets=host_process_sets())
torch.set_num_threads(1)


def hierarchical(make, **kwargs):
    return lambda m: make(exchange="hierarchical", named_parameters=m.named_parameters(), **EVERY, **kwargs)


CONFIGS = {
    "dense": lambda m: hvd.Compression.none,
    "topk_0.1_hierarchical": hierarchical(TopK, ratio=0.1),
    "topk_1.0_hierarchical": hierarchical(TopK, ratio=1.0, dense_fallback=False),
    "threshold_0.1_hierarchical": hierarchical(Threshold, ratio=0.1),
    "rtopk_0.1_hierarchical": hierarchical(RTopK, ratio=0.1, r=0.3, seed=7),
    "dgc_0.1_hierarchical": hierarchical(DGC, ratio=0.1, momentum=0.9),
    "topk_0.1_no_feedback_hierarchical": hierarchical(TopK, ratio=0.1, error_feedback=False),
    "threshold_fp16_0.1_hierarchical": hierarchical(Threshold, ratio=0.1, quantize="fp16"),
    "topk_0.1_allgather": lambda m: TopK(
        ratio=0.1, exchange="allgather", named_parameters=m.named_parameters(), **EVERY
    ),
}
results = common.train_recorded(CONFIGS, {}, args.steps, args.lr)
results["layout"] = {"local_rank": hvd.local_rank(), "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank()}
torch.save(results, os.path.join(args.out, f"rank{hvd.rank()}.pt"))
print(f"rank {hvd.rank()}/{hvd.size()}: {len(results) - 1} configs done")
