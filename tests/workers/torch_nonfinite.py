"""Worker: a burst of NaN and +-Inf in rank 1's gradient at one step (common.BURST), through
Horovod's allreduce with each compressor, on a float32 parameter. Saves, per step, the
reduced gradient every rank got and its compressor state (residual, momentum)."""

import os

import common
import horovod.torch as hvd
import torch

from sparsecomm.torch import DGC, RandomBlock, RandomK, RTopK, Threshold, TopK

args = common.worker_parser().parse_args()
common.start_torch()
CONFIGS = {
    "topk": lambda named: TopK(exchange="allgather", ratio=0.05, named_parameters=named),
    "topk_spardl": lambda named: TopK(exchange="spardl", ratio=0.05, named_parameters=named),
    "threshold": lambda named: Threshold(exchange="allgather", ratio=0.05, named_parameters=named),
    "threshold_2bit": lambda named: Threshold(
        exchange="allgather", ratio=0.05, quantize="2bit", named_parameters=named
    ),
    "dgc": lambda named: DGC(exchange="allgather", ratio=0.05, momentum=0.9, named_parameters=named),
    "dgc_no_masking": lambda named: DGC(
        exchange="allgather", ratio=0.05, momentum=0.9, momentum_masking=False, named_parameters=named
    ),
    "rtopk": lambda named: RTopK(exchange="allgather", ratio=0.05, r=0.2, seed=3, named_parameters=named),
    "randomk": lambda named: RandomK(ratio=common.BURST_RANDOM_RATIO, seed=3, named_parameters=named),
    "random_block": lambda named: RandomBlock(ratio=common.BURST_RANDOM_RATIO, seed=3, named_parameters=named),
}
results = {}
for config, make in CONFIGS.items():
    p = torch.nn.Parameter(torch.zeros(common.BURST_SHAPE))
    compression = make([("w", p)])
    history = []
    for step in range(common.BURST_STEPS):
        p.grad = torch.from_numpy(common.burst_gradient(step, hvd.rank()))
        reduced = hvd.allreduce(p.grad, op=hvd.Average, compression=compression, name=config)
        state = compression.state_dict()["parameters"]["w"]
        history.append(
            {
                "reduced": reduced.reshape(-1).clone(),
                **{key: state[key].clone() for key in ("residual", "momentum") if state[key] is not None},
            }
        )
    results[config] = history
torch.save(results, os.path.join(args.out, f"rank{hvd.rank()}.pt"))
print(f"rank {hvd.rank()}/{hvd.size()}: {len(results)} configs done")
