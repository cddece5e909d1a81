"""Worker: SGD steps of the digits MLP under hvd.DistributedOptimizer with exchange="hierarchical"
for each per-rank-coordinate method, on the hosts horovodrun's -H gives (their process sets
registered at hvd.init), beside dense and the flat allgather. Saves what torch_spardl.py saves
(common.train_recorded) and each rank's place, for a replay of the hosts."""

import os

import common
import horovod.torch as hvd
import torch
from common import EVERY

from sparsecomm import Network
from sparsecomm.core import plan
from sparsecomm.torch import DGC, RTopK, Threshold, TopK, host_process_sets

args = common.worker_parser(steps=4, lr=0.5).parse_args()
common.start_torch(process_sets=host_process_sets())


def hierarchical(make, **kwargs):
    return lambda m: make(exchange="hierarchical", named_parameters=m.named_parameters(), **EVERY, **kwargs)


MEASURED = {}  # config -> what auto's measurement found of the hosts: (hosts, ranks a host, link bytes/s)
SLOW_NIC = Network(bandwidth=1e4, latency=1e-6)  # the model's bytes decide: hierarchical's are a third of allgather's


def auto(config, nic=None):
    """TopK 10% with exchange="auto": it watches 2 steps (by allgather), measures at step 2 (the
    hosts included; the watched step left out, so that every side is tried), routes by the model
    there, by SparDL and by hierarchical alone the next two steps (the trial's uncounted steps),
    then by the model's routes (AUTO_STEPS). With `nic`, the
    measured network is replaced by it (the hosts' link kept) and nothing is hidden by the
    backward."""

    def make(m):
        compression = TopK(ratio=0.1, named_parameters=m.named_parameters(), **EVERY)
        measure = compression._measure_network

        def measured(device):
            network, local, windows, hosts, _ = measure(device)  # no watched step: every side is tried
            MEASURED[config] = None if hosts is None else (hosts.count, hosts.per_host, hosts.link.bandwidth)
            return (network, local, windows, hosts) if nic is None else (nic, local, {}, hosts)

        compression._measure_network = measured
        return compression

    return make


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
AUTO_CONFIGS = {
    "topk_0.1_auto": auto("topk_0.1_auto"),
    "topk_0.1_auto_slow_nic": auto("topk_0.1_auto_slow_nic", SLOW_NIC),
}
AUTO_STEPS = plan.first_counted_step(hosts=True) + 1  # the last one routed by the model
results = common.train_recorded(CONFIGS, {}, args.steps, args.lr)
results.update(common.train_recorded(AUTO_CONFIGS, {}, max(args.steps, AUTO_STEPS), args.lr))
results["measured_hosts"] = MEASURED
results["layout"] = {"local_rank": hvd.local_rank(), "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank()}
torch.save(results, os.path.join(args.out, f"rank{hvd.rank()}.pt"))
print(f"rank {hvd.rank()}/{hvd.size()}: {len(results) - 2} configs done")
